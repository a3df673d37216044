"""Input shapes shared by the REST bodies and the MCP tool schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api_service.store.records import NewMessage

Role = Literal["user", "assistant", "system", "tool"]


class MessageInput(BaseModel):
    """One message to append."""

    model_config = ConfigDict(extra="forbid")

    role: Role = Field(description="user, assistant, system or tool")
    content: str = Field(description="Message content, stored verbatim")
    tool_call_id: str | None = Field(default=None, description="Tool call this message answers")
    tool_name: str | None = Field(default=None, description="Name of the tool called")
    metadata: dict[str, Any] | None = Field(default=None, description="Key-value metadata")

    def to_new(self) -> NewMessage:
        return NewMessage(
            role=self.role,
            content=self.content,
            tool_call_id=self.tool_call_id,
            tool_name=self.tool_name,
            metadata=self.metadata,
        )
