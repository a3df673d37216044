"""MCP adapter: the six tools over the memory core, served with Streamable HTTP at /mcp.

A tool returns its response object as structured content and as JSON text; a failure returns
`{"error": "<text>"}` the same way with isError set.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import Field, ValidationError

from api_service.auth import Principal, Scope
from api_service.core.errors import ServiceError, Unauthorized, classify
from api_service.core.inputs import MessageInput
from api_service.core.memory import MAX_OFFSET, MemoryService


def result(payload: dict[str, Any], *, error: bool = False) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
        structured_content=payload,
        is_error=error,
    )


def error_result(message: str) -> CallToolResult:
    return result({"error": message}, error=True)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid arguments: " + "; ".join(parts)


# The scope each tool needs, checked before its arguments: a key learns nothing about the
# arguments of a call it may not make. The core checks it again.
TOOL_SCOPES: dict[str, Scope] = {
    "create_conversation": "write",
    "append_messages": "write",
    "search": "read",
    "get_conversation": "read",
    "list_conversations": "read",
    "delete_conversation": "write",
}


class MemoryMCP(MCPServer[Any]):
    """MCPServer whose tool failures all take the `{"error": ...}` shape."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        if context is not None:
            refused = _request_state(context).get("rate_limited")
            if refused:
                return error_result(refused)
            if name in TOOL_SCOPES:
                try:
                    _caller(context).require(TOOL_SCOPES[name])
                except ServiceError as exc:
                    return error_result(exc.message)
        schema = self._tool_input_schema(name)
        if schema is not None:
            unknown = sorted(set(arguments) - set(schema.get("properties", {})))
            if unknown:
                return error_result(f"Invalid arguments: unknown {', '.join(unknown)}")
        # null means absent, as for REST's optional fields
        arguments = {k: v for k, v in arguments.items() if v is not None}
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                return error_result(_describe(cause))
            if cause is None:  # unknown tool and the like: the SDK's text is for the caller
                return error_result(str(exc))
            return error_result(classify(cause).message)


def _request_state(ctx: Context[Any, Any]) -> dict[str, Any]:
    """What the HTTP middleware put in the request state (principal, rate limit)."""
    request = ctx.request_context.request
    state: dict[str, Any] = {} if request is None else request.scope.get("state", {})
    return state


def _caller(ctx: Context[Any, Any]) -> Principal:
    principal = _request_state(ctx).get("principal")
    if not isinstance(principal, Principal):
        raise Unauthorized("Unauthorized")  # unreachable behind the auth middleware
    return principal


def _text(description: str) -> Any:
    """An optional string argument. Typed plain `str` with a default of None, because the SDK
    JSON-decodes string arguments of any other type (`"null"` would arrive as None); declared
    as a string or null, which `MemoryMCP.call_tool` takes as absent, so that the default
    fits its own schema."""
    return Field(default=None, description=description, json_schema_extra=_string_or_null)


def _string_or_null(schema: dict[str, Any]) -> None:
    del schema["type"]
    schema["anyOf"] = [{"type": "string"}, {"type": "null"}]


def _int(description: str, low: int, high: int) -> Any:
    """A strict integer argument (`true` is not a limit) between `low` and `high`."""
    return Field(strict=True, description=description, ge=low, le=high)


def build_mcp(memory_of: Callable[[], MemoryService]) -> MemoryMCP:
    """The MCP server with the six memory tools; `memory_of` gives the started core."""
    server = MemoryMCP(
        "conversation-memory",
        instructions=(
            "Long-term memory of conversations. Store turns with append_messages, find them "
            "again by meaning with search, and fetch full messages with get_conversation."
        ),
    )

    async def run(call: Awaitable[dict[str, Any]]) -> CallToolResult:
        return result(await call)  # failures are shaped once, in MemoryMCP.call_tool

    @server.tool()
    async def create_conversation(
        ctx: Context[Any, Any],
        title: Annotated[str, _text("Title")],
        agent_id: Annotated[str, _text("Owning agent identifier")],
        tags: Annotated[list[str] | None, Field(description="Tags")] = None,
        metadata: Annotated[dict[str, Any] | None, Field(description="Key-value metadata")] = None,
    ) -> CallToolResult:
        """Create a conversation; returns {conversation_id}."""
        return await run(
            memory_of().create_conversation(
                _caller(ctx), title=title, agent_id=agent_id, tags=tags, metadata=metadata
            )
        )

    @server.tool()
    async def append_messages(
        ctx: Context[Any, Any],
        conversation_id: Annotated[str, Field(description="Target conversation")],
        messages: Annotated[list[MessageInput], Field(min_length=1, description="At least 1")],
    ) -> CallToolResult:
        """Append messages in order; returns {appended, message_ids}."""

        async def call() -> dict[str, Any]:
            out = await memory_of().append_messages(
                _caller(ctx), conversation_id, [m.to_new() for m in messages]
            )
            return {"appended": out["appended"], "message_ids": out["message_ids"]}

        return await run(call())

    @server.tool()
    async def search(
        ctx: Context[Any, Any],
        query: Annotated[str, Field(description="Natural-language query")],
        conversation_id: Annotated[str, _text("Restrict to one conversation")],
        project: Annotated[str, _text("Only conversations whose metadata.project equals this")],
        limit: Annotated[int, _int("Max results, 1 to 50", 1, 50)] = 5,
        tags: Annotated[list[str] | None, Field(description="Filter by conversation tags")] = None,
        snippet_chars: Annotated[
            int, _int("Max characters of chunk_text, at most 5000", 15, 5000)
        ] = 1500,
    ) -> CallToolResult:
        """Find chunks of stored conversations by meaning, ranked by cosine similarity;
        returns {results, total}. Fetch full messages with get_conversation using
        message_offset = start_sequence - 1."""
        return await run(
            memory_of().search(
                _caller(ctx),
                query,
                limit=limit,
                conversation_id=conversation_id,
                tags=tags,
                project=project,
                snippet_chars=snippet_chars,
            )
        )

    @server.tool()
    async def get_conversation(
        ctx: Context[Any, Any],
        conversation_id: Annotated[str, Field(description="Conversation to fetch")],
        message_limit: Annotated[int, _int("Max messages", 1, 500)] = 100,
        message_offset: Annotated[int, _int("Pagination offset", 0, MAX_OFFSET)] = 0,
    ) -> CallToolResult:
        """Fetch a conversation and its messages in sequence order."""
        return await run(
            memory_of().get_conversation(
                _caller(ctx),
                conversation_id,
                message_limit=message_limit,
                message_offset=message_offset,
            )
        )

    @server.tool()
    async def list_conversations(
        ctx: Context[Any, Any],
        agent_id: Annotated[str, _text("Filter by agent")],
        limit: Annotated[int, _int("Max conversations", 1, 100)] = 20,
        offset: Annotated[int, _int("Pagination offset", 0, MAX_OFFSET)] = 0,
        tags: Annotated[list[str] | None, Field(description="Filter by tags (all)")] = None,
        sort: Annotated[
            Literal["created_at", "updated_at", "message_count"], Field(description="Sort key")
        ] = "updated_at",
        order: Annotated[Literal["asc", "desc"], Field(description="Sort order")] = "desc",
    ) -> CallToolResult:
        """List the organization's conversations; returns {conversations, total}."""
        return await run(
            memory_of().list_conversations(
                _caller(ctx),
                limit=limit,
                offset=offset,
                agent_id=agent_id,
                tags=tags,
                sort=sort,
                order=order,
            )
        )

    @server.tool()
    async def delete_conversation(
        ctx: Context[Any, Any],
        conversation_id: Annotated[str, Field(description="Conversation to delete")],
    ) -> CallToolResult:
        """Permanently delete a conversation, its messages, chunks and vectors."""
        return await run(memory_of().delete_conversation(_caller(ctx), conversation_id))

    return server
