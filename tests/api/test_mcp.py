"""The six MCP tools through the SDK's own Streamable HTTP client against the real service."""

from __future__ import annotations

from tests.api.harness import Service


async def test_six_tools_each_called(service: Service, key: str) -> None:
    async with service.mcp(key) as mcp:
        names = sorted(t.name for t in (await mcp.client.list_tools()).tools)
        assert names == [
            "append_messages",
            "create_conversation",
            "delete_conversation",
            "get_conversation",
            "list_conversations",
            "search",
        ]

        created = await mcp.ok(
            "create_conversation",
            title="Plans",
            agent_id="a1",
            tags=["work"],
            metadata={"project": "p"},
        )
        assert set(created) == {"conversation_id"}
        cid = created["conversation_id"]

        appended = await mcp.ok(
            "append_messages",
            conversation_id=cid,
            messages=[
                {"role": "user", "content": "The launch is scheduled for March"},
                {"role": "tool", "content": "{}", "tool_call_id": "c1", "tool_name": "calendar"},
            ],
        )
        assert appended["appended"] == 2 and set(appended) == {"appended", "message_ids"}

        got = await mcp.ok(
            "get_conversation", conversation_id=cid, message_limit=1, message_offset=1
        )
        assert got["conversation"]["message_count"] == 2
        assert [m["sequence"] for m in got["messages"]] == [2]
        assert got["messages"][0]["tool_name"] == "calendar"

        listed = await mcp.ok("list_conversations", agent_id="a1", tags=["work"])
        assert listed["total"] == 1 and listed["conversations"][0]["id"] == cid

        found = await mcp.ok("search", query="when is the launch scheduled", limit=3)
        assert found["total"] == len(found["results"]) >= 1
        hit = found["results"][0]
        assert set(hit) == {
            "chunk_id",
            "conversation_id",
            "chunk_text",
            "score",
            "start_sequence",
            "end_sequence",
        }
        assert hit["conversation_id"] == cid and hit["chunk_id"].startswith("chk_")
        assert hit["chunk_text"].startswith("[user]: The launch is scheduled for March")
        assert (hit["start_sequence"], hit["end_sequence"]) == (1, 2)

        assert await mcp.ok("delete_conversation", conversation_id=cid) == {"deleted": True}
        assert await mcp.error("get_conversation", conversation_id=cid) == "Conversation not found"
        assert (
            await mcp.error("delete_conversation", conversation_id=cid) == "Conversation not found"
        )


async def test_served_under_any_host_name_and_origin(service: Service, key: str) -> None:
    """Reached as a Service, through an ingress or from a browser page, not only as localhost
    (the SDK's default answers 421 to any other Host)."""
    for headers in (
        {"Host": "api:8080"},
        {"Host": "memory.example.com", "Origin": "https://agents.example.com"},
    ):
        async with service.mcp(key, **headers) as mcp:
            assert len((await mcp.client.list_tools()).tools) == 6
            assert "conversation_id" in await mcp.ok("create_conversation")


async def test_tool_errors_name_the_parameter(service: Service, key: str) -> None:
    async with service.mcp(key) as mcp:
        cid = (await mcp.ok("create_conversation"))["conversation_id"]
        cases = [
            ("search", {"query": "x", "limit": 51}, "limit"),
            ("search", {"query": "x", "limit": 0}, "limit"),
            ("search", {"query": "x", "snippet_chars": 5001}, "snippet_chars"),
            ("search", {"query": ""}, "query"),
            ("search", {"limit": 3}, "query"),
            ("list_conversations", {"limit": 101}, "limit"),
            ("list_conversations", {"sort": "title"}, "sort"),
            ("list_conversations", {"order": "sideways"}, "order"),
            ("get_conversation", {"conversation_id": cid, "message_limit": 501}, "message_limit"),
            ("get_conversation", {"conversation_id": cid, "message_offset": -1}, "message_offset"),
            ("append_messages", {"conversation_id": cid, "messages": []}, "messages"),
            (
                "append_messages",
                {"conversation_id": cid, "messages": [{"role": "bot", "content": "x"}]},
                "role",
            ),
            (
                "append_messages",
                {"conversation_id": cid, "messages": [{"role": "user", "content": "x" * 100_001}]},
                "content",
            ),
            ("create_conversation", {"tags": ["bad tag"]}, "tags"),
            ("create_conversation", {"title": 7}, "title"),
        ]
        for tool, arguments, needle in cases:
            message = await mcp.error(tool, **arguments)
            assert needle in message, (tool, arguments, message)
        got = await mcp.ok("get_conversation", conversation_id=cid)
        assert got["messages"] == []  # nothing stored by the refused appends
        assert (
            await mcp.error(
                "append_messages",
                conversation_id="conv_missing",
                messages=[{"role": "user", "content": "x"}],
            )
            == "Conversation not found"
        )


async def test_arguments_arrive_as_sent(service: Service, key: str) -> None:
    async with service.mcp(key) as mcp:
        for title in ("null", "[1]", '{"$ne": null}', "42"):  # never JSON-decoded
            cid = (await mcp.ok("create_conversation", title=title))["conversation_id"]
            got = await mcp.ok("get_conversation", conversation_id=cid)
            assert got["conversation"]["title"] == title
        cid = (await mcp.ok("create_conversation", title=None, agent_id=None))[
            "conversation_id"
        ]  # null means absent
        assert (await mcp.ok("get_conversation", conversation_id=cid))["conversation"][
            "title"
        ] is None
        assert "unknown unexpected" in await mcp.error("create_conversation", unexpected=1)
        assert "limit" in await mcp.error("list_conversations", limit=True)
    async with service.rest(key) as http:  # raw JSON: the SDK client would send null
        for token in ("NaN", "Infinity", "1e999"):
            body = (
                '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
                f'"create_conversation", "arguments": {{"metadata": {{"n": {token}}}}}}}}}'
            )
            r = await http.post(
                "/mcp",
                content=body,
                headers={
                    "Content-Type": "application/json",
                    "Accept": "application/json, text/event-stream",
                },
            )
            assert r.status_code == 200, r.text
            result = r.json()["result"]
            assert result["isError"] and "metadata" in result["structuredContent"]["error"]
