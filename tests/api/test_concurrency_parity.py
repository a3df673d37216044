"""Gapless sequences under concurrent appends, and REST and MCP agreeing on the same data."""

from __future__ import annotations

import asyncio

from tests.api.harness import Service


async def test_twenty_concurrent_appenders_get_sequences_1_to_200(
    service: Service, key: str
) -> None:
    async with service.rest(key) as http:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]

        async def appender(worker: int) -> None:
            for i in range(10):
                r = await http.post(
                    "/api/v1/messages",
                    json={
                        "conversation_id": cid,
                        "messages": [{"role": "user", "content": f"w{worker}-{i}"}],
                    },
                )
                assert r.status_code == 200, r.text

        await asyncio.gather(*(appender(w) for w in range(20)))
        got = (await http.get(f"/api/v1/conversations/{cid}", params={"message_limit": 500})).json()
    sequences = [m["sequence"] for m in got["messages"]]
    assert sequences == list(range(1, 201))
    assert len({m["content"] for m in got["messages"]}) == 200
    assert got["conversation"]["message_count"] == 200
    for worker in range(20):  # each worker's messages keep its own order
        mine = [m["content"] for m in got["messages"] if m["content"].startswith(f"w{worker}-")]
        assert mine == [f"w{worker}-{i}" for i in range(10)]


async def test_rest_and_mcp_agree(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        via_rest = (
            await http.post(
                "/api/v1/conversations", json={"title": "r", "agent_id": "ag", "tags": ["x"]}
            )
        ).json()["conversation_id"]
        via_mcp = (await mcp.ok("create_conversation", title="m", agent_id="ag", tags=["x"]))[
            "conversation_id"
        ]
        messages = [
            {"role": "user", "content": "the meeting moved to Thursday"},
            {"role": "assistant", "content": "noted"},
        ]
        await http.post("/api/v1/messages", json={"conversation_id": via_mcp, "messages": messages})
        await mcp.ok("append_messages", conversation_id=via_rest, messages=messages)

        for cid in (via_rest, via_mcp):
            rest_get = (await http.get(f"/api/v1/conversations/{cid}")).json()
            assert rest_get == await mcp.ok("get_conversation", conversation_id=cid)
        for params in (
            {},
            {"agent_id": "ag", "sort": "created_at", "order": "asc"},
            {"limit": 1, "offset": 1},
        ):
            rest_list = (await http.get("/api/v1/conversations", params=params)).json()
            assert rest_list == await mcp.ok("list_conversations", **params)
        rest_list = (await http.get("/api/v1/conversations", params={"tags": "x"})).json()
        assert rest_list == await mcp.ok("list_conversations", tags=["x"])

        r = await http.get("/api/v1/conversations/conv_missing")
        assert r.status_code == 404
        assert r.json()["error"] == await mcp.error(
            "get_conversation", conversation_id="conv_missing"
        )

        assert (await http.delete(f"/api/v1/conversations/{via_mcp}")).json() == await mcp.ok(
            "delete_conversation", conversation_id=via_rest
        )
