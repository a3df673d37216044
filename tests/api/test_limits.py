"""Plans and the meter on both interfaces: 429 past the monthly quota, 402 past storage,
conversation or message limits with nothing stored, and the usage the org can see."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from tests.api.harness import Service


async def _set_plan(
    service: Service,
    org_id: str,
    *,
    requests: int = 1000,
    storage: int = 10**9,
    convs: int = 100,
    messages: int = 10**6,
) -> None:
    conn = await asyncpg.connect(service.database_url)
    try:
        name = f"plan_{org_id}"
        await conn.execute(
            "INSERT INTO plans "
            "(name, monthly_requests, storage_bytes, max_conversations, max_messages) "
            "VALUES ($1, $2, $3, $4, $5)",
            name,
            requests,
            storage,
            convs,
            messages,
        )
        await conn.execute("UPDATE orgs SET plan = $2 WHERE org_id = $1", org_id, name)
    finally:
        await conn.close()


async def _set_used(service: Service, org_id: str, requests: int) -> None:
    now = datetime.now(UTC)
    conn = await asyncpg.connect(service.database_url)
    try:
        await conn.execute(
            "INSERT INTO usage (org_id, month, requests) VALUES ($1, $2, $3)",
            org_id,
            now.date().replace(day=1),
            requests,
        )
    finally:
        await conn.close()


async def test_ten_left_fifty_concurrent_exactly_ten_pass(service: Service) -> None:
    org_id, key = await service.org_with_key()
    await _set_plan(service, org_id, requests=100)
    await _set_used(service, org_id, 90)
    async with service.rest(key) as http:
        responses = await asyncio.gather(*(http.get("/api/v1/conversations") for _ in range(50)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    ok = next(r for r in responses if r.status_code == 200)
    assert ok.headers["X-RateLimit-Limit"] == "100"
    assert 0 <= int(ok.headers["X-RateLimit-Remaining"]) <= 9
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["code"] == "rate_limited"
    assert "Monthly request quota of 100 reached" in refused.json()["error"]
    assert int(refused.headers["Retry-After"]) > 0
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    reset = int(refused.headers["X-RateLimit-Reset"])
    assert datetime.fromtimestamp(reset, UTC).day == 1

    async with service.mcp(key) as mcp:  # MCP: the same text as a tool error
        assert await mcp.error("list_conversations") == refused.json()["error"]


async def test_storage_limit_refuses_the_whole_write(service: Service) -> None:
    org_id, key = await service.org_with_key()
    await _set_plan(service, org_id, storage=400)
    async with service.rest(key) as http:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
        r = await http.post(
            "/api/v1/messages",
            json={"conversation_id": cid, "messages": [{"role": "user", "content": "a" * 300}]},
        )
        assert r.status_code == 200
        before = (await http.get(f"/api/v1/conversations/{cid}")).json()
        usage_before = (await http.get("/api/v1/usage")).json()
        r = await http.post(
            "/api/v1/messages",
            json={
                "conversation_id": cid,
                "messages": [
                    {"role": "user", "content": "b" * 50},
                    {"role": "user", "content": "c" * 60},
                ],
            },
        )
        assert r.status_code == 402, r.text
        assert r.json()["code"] == "limit_reached" and "Storage limit of 400" in r.json()["error"]
        after = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert after == before  # no message, no count change, no updated_at change
        usage_after = (await http.get("/api/v1/usage")).json()
        assert usage_after["storage_bytes"] == usage_before["storage_bytes"] == 300
        async with service.mcp(key) as mcp:
            message = await mcp.error(
                "append_messages",
                conversation_id=cid,
                messages=[{"role": "user", "content": "d" * 200}],
            )
            assert message == r.json()["error"].replace("110 more", "200 more")
    conn = await asyncpg.connect(service.database_url)
    try:
        assert (
            await conn.fetchval("SELECT count(*) FROM chunks WHERE conversation_id = $1", cid) == 1
        )
        assert (
            await conn.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", cid)
            == 1
        )
    finally:
        await conn.close()


async def test_the_default_memory_gives_back_every_byte_it_took(service: Service) -> None:
    """The append that creates the org's default memory charges its title's bytes once, to
    the conversation and to the org alike, so deleting it leaves the org at zero."""
    _, key = await service.org_with_key()
    async with service.rest(key) as http:
        for content in ("remember this", "and this"):
            r = await http.post(
                "/api/v1/messages", json={"messages": [{"role": "user", "content": content}]}
            )
            assert r.status_code == 200, r.text
        cid = r.json()["conversation_id"]
        used = (await http.get("/api/v1/usage")).json()["storage_bytes"]
        assert used == len("Default memory") + len("remember this") + len("and this")
        conn = await asyncpg.connect(service.database_url)
        try:
            size = await conn.fetchval(
                "SELECT storage_bytes FROM conversations WHERE conversation_id = $1", cid
            )
        finally:
            await conn.close()
        assert size == used
        assert (await http.delete(f"/api/v1/conversations/{cid}")).status_code == 200
        assert (await http.get("/api/v1/usage")).json()["storage_bytes"] == 0


async def test_conversation_limit_and_usage(service: Service) -> None:
    org_id, key = await service.org_with_key()
    await _set_plan(service, org_id, convs=2, requests=500)
    async with service.rest(key) as http, service.mcp(key) as mcp:
        first = (await http.post("/api/v1/conversations", json={"title": "ab"})).json()
        await mcp.ok("create_conversation")
        r = await http.post("/api/v1/conversations", json={})
        assert r.status_code == 402 and "Conversation limit of 2" in r.json()["error"]
        assert await mcp.error("create_conversation") == r.json()["error"]
        r = await http.post(
            "/api/v1/messages",
            json={
                "messages": [  # the default memory too
                    {"role": "user", "content": "x"}
                ]
            },
        )
        assert r.status_code == 402
        assert (await http.get("/api/v1/conversations")).json()["total"] == 2

        await http.delete(f"/api/v1/conversations/{first['conversation_id']}")
        assert (await http.post("/api/v1/conversations", json={})).status_code == 201
        usage = (await http.get("/api/v1/usage")).json()
    assert usage["conversations"] == 2 and usage["conversations_limit"] == 2
    assert usage["requests_limit"] == 500 and usage["storage_bytes_limit"] == 10**9
    assert usage["messages"] == 0 and usage["messages_limit"] == 10**6
    assert usage["month"] == datetime.now(UTC).strftime("%Y-%m")
    assert usage["requests"] >= 9  # every request so far counted, refused ones too
    assert set(usage) == {
        "month",
        "requests",
        "requests_limit",
        "storage_bytes",
        "storage_bytes_limit",
        "conversations",
        "conversations_limit",
        "messages",
        "messages_limit",
    }


async def test_message_limit_counts_empty_messages(service: Service) -> None:
    """Messages count whatever their size: empty ones store no bytes, but each costs a row,
    a share of a window and its vector. A delete gives its messages back."""
    org_id, key = await service.org_with_key()
    await _set_plan(service, org_id, messages=5)
    empty = {"role": "assistant", "content": ""}
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
        r = await http.post(
            "/api/v1/messages", json={"conversation_id": cid, "messages": [empty] * 4}
        )
        assert r.status_code == 200, r.text
        r = await http.post(
            "/api/v1/messages", json={"conversation_id": cid, "messages": [empty] * 2}
        )
        assert r.status_code == 402
        assert r.json()["error"] == (
            "Message limit of 5 reached (4 stored, this write adds 2); delete conversations "
            "or move to a larger plan"
        )
        assert (
            await mcp.error("append_messages", conversation_id=cid, messages=[empty] * 2)
            == r.json()["error"]
        )
        r = await http.post("/api/v1/messages", json={"conversation_id": cid, "messages": [empty]})
        assert r.status_code == 200, r.text
        usage = (await http.get("/api/v1/usage")).json()
        assert (usage["messages"], usage["messages_limit"], usage["storage_bytes"]) == (5, 5, 0)
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert len(got["messages"]) == 5  # the refused appends stored nothing

        assert (await http.delete(f"/api/v1/conversations/{cid}")).status_code == 200
        assert (await http.get("/api/v1/usage")).json()["messages"] == 0
        r = await http.post("/api/v1/messages", json={"messages": [empty] * 5})
        assert r.status_code == 200, r.text


async def test_every_refused_request_counts(service: Service) -> None:
    """Requests refused for their scope, their input or their size count like the rest: one
    each, on top of the usage calls themselves."""
    org_id, key = await service.org_with_key()
    reader = await service.key_for(org_id, ("read",))
    async with service.rest(key) as http:
        before = (await http.get("/api/v1/usage")).json()["requests"]
        r = await http.post("/api/v1/messages", content=b"x" * (5 * 1024 * 1024))
        assert r.status_code == 413 and "x-ratelimit-remaining" in r.headers
        assert (await http.get("/api/v1/search", params={"q": ""})).status_code == 400
    async with service.rest(reader) as http:
        assert (await http.post("/api/v1/conversations", json={})).status_code == 403
    async with service.rest(key) as http:
        after = (await http.get("/api/v1/usage")).json()["requests"]
    assert after == before + 4  # three refused, and the second usage call
