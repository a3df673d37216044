"""Keys and tenants: 401/403 on both interfaces, scopes, and no view of another org's data."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import httpx
import httpx2
import pytest

from api_service import auth
from api_service.store import admin
from tests.api.harness import Service, eventually, running_service

REST_CALLS = [
    ("GET", "/api/v1/conversations", None),
    ("POST", "/api/v1/conversations", {}),
    ("GET", "/api/v1/search?q=x", None),
]


async def _mcp_status(service: Service, headers: dict[str, str]) -> int:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{service.base_url}/mcp",
            json=body,
            headers={"Accept": "application/json, text/event-stream", **headers},
        )
        return r.status_code


async def test_missing_invalid_expired_revoked_keys(service: Service) -> None:
    _, expired = await service.org_with_key()
    await service.expire_key(expired)
    _, revoked = await service.org_with_key()
    await service.revoke_key(revoked)
    cases = [
        ({}, 401),
        ({"Authorization": "Bearer cmk_not_a_real_key"}, 401),
        ({"Authorization": "Basic abc"}, 401),
        ({"Authorization": f"Bearer {expired}"}, 403),
        ({"Authorization": f"Bearer {revoked}"}, 403),
    ]
    async with httpx.AsyncClient(base_url=service.base_url) as http:
        for headers, status in cases:
            for method, path, body in REST_CALLS:
                r = await http.request(method, path, json=body, headers=headers)
                assert r.status_code == status, (headers, path)
                assert set(r.json()) == {"error", "code"}
            assert await _mcp_status(service, headers) == status, headers
    r = await httpx.AsyncClient(base_url=service.base_url).get(
        "/api/v1/conversations", headers={"Authorization": f"Bearer {expired}"}
    )
    assert "expired" in r.json()["error"]


async def test_a_key_is_kept_resolved_until_revoked(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the key cache listens, a known key needs no lookup; revoking the key empties the
    cache at once (well within the entries' 60 s life), and the next request is refused."""
    _, key = await service.org_with_key()
    lookups: list[bytes] = []
    lookup = admin.key_by_hash

    async def counted(conn: asyncpg.Pool, key_hash: bytes) -> admin.KeyMatch | None:
        lookups.append(key_hash)
        return await lookup(conn, key_hash)

    monkeypatch.setattr(admin, "key_by_hash", counted)
    async with service.rest(key) as http:

        async def served_from_memory() -> bool:
            before = len(lookups)
            assert (await http.get("/api/v1/usage")).status_code == 200
            return len(lookups) == before

        async def refused() -> bool:
            return (await http.get("/api/v1/usage")).status_code == 403

        assert await eventually(served_from_memory)
        await service.revoke_key(key)
        assert await eventually(refused, seconds=2.0)
        assert auth.hash_key(key) in lookups


async def test_a_plan_changed_after_use_applies(service: Service) -> None:
    """The org's plan comes with its key, and a change to either the org's plan or the plan's
    limits reaches a key already kept in memory."""
    org_id, key = await service.org_with_key()
    async with service.rest(key) as http:

        def limit_is(expected: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                r = await http.get("/api/v1/usage")
                return bool(r.headers["X-RateLimit-Limit"] == expected)

            return check

        default = (await http.get("/api/v1/usage")).headers["X-RateLimit-Limit"]
        assert await eventually(limit_is(default))
        conn = await asyncpg.connect(service.database_url)
        try:
            await conn.execute(
                "INSERT INTO plans (name, monthly_requests, storage_bytes, max_conversations) "
                "VALUES ('small', 123, 1000000, 10)"
            )
            await conn.execute("UPDATE orgs SET plan = 'small' WHERE org_id = $1", org_id)
            assert await eventually(limit_is("123"), seconds=2.0)
            await conn.execute("UPDATE plans SET monthly_requests = 456 WHERE name = 'small'")
            assert await eventually(limit_is("456"), seconds=2.0)
        finally:
            await conn.close()


async def test_the_key_cache_keeps_nothing_unless_listening(database_url: str) -> None:
    """Entries are kept only while a connection listens for changes: not before it, not after
    it is lost, not once a change is announced, not past their life, and not from a read that
    an emptying overtook."""
    conn = await asyncpg.connect(database_url)
    try:
        org = await admin.create_org(conn, "org_cache", "cache", None)
        secret, _ = await auth.issue_key(conn, org.org_id, ["read"], None)
        digest = auth.hash_key(secret)
        match = await admin.key_by_hash(conn, digest)
        assert match is not None
        now = [0.0]
        cache = auth.KeyCache(ttl_seconds=60.0, clock=lambda: now[0])

        async def kept() -> bool:
            cache.put(digest, match, cache.generation)
            return cache.get(digest) is match

        async def emptied() -> bool:
            return cache.get(digest) is None

        async def not_listening() -> bool:
            return not cache.listening

        assert not await kept()  # not listening yet
        listening = asyncio.create_task(cache.listen(database_url))
        try:
            assert await eventually(kept)
            await conn.execute("UPDATE api_keys SET scopes = scopes WHERE key_hash = $1", digest)
            assert await eventually(emptied)

            read_at = cache.generation
            cache.clear()  # a change announced while the read was under way
            cache.put(digest, match, read_at)
            assert cache.get(digest) is None

            assert await kept()
            now[0] += 61
            assert cache.get(digest) is None  # past its life

            assert await kept()
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
            assert await eventually(not_listening)
            assert not await kept()
            assert await eventually(kept)  # listening again
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
    finally:
        await conn.close()


async def test_read_only_key_cannot_write(service: Service) -> None:
    org_id, writer = await service.org_with_key()
    reader = await service.key_for(org_id, ("read",))
    async with service.rest(writer) as http:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
        mid = (
            await http.post(
                "/api/v1/messages",
                json={"conversation_id": cid, "messages": [{"role": "user", "content": "x"}]},
            )
        ).json()["message_ids"][0]
    async with service.rest(reader) as http:
        assert (await http.get(f"/api/v1/conversations/{cid}")).status_code == 200
        for method, path, body in [
            ("POST", "/api/v1/conversations", {}),
            (
                "POST",
                "/api/v1/messages",
                {"conversation_id": cid, "messages": [{"role": "user", "content": "y"}]},
            ),
            ("PATCH", f"/api/v1/conversations/{cid}/messages/{mid}", {"content": "z"}),
            ("DELETE", f"/api/v1/conversations/{cid}", None),
        ]:
            r = await http.request(method, path, json=body)
            assert r.status_code == 403, path
            assert r.json() == {"error": "Forbidden: missing scope write", "code": "forbidden"}
    async with service.mcp(reader) as mcp:
        assert await mcp.error("create_conversation") == "Forbidden: missing scope write"
        assert (
            await mcp.error("delete_conversation", conversation_id=cid)
            == "Forbidden: missing scope write"
        )
        assert (await mcp.ok("get_conversation", conversation_id=cid))["messages"][0][
            "content"
        ] == "x"
    write_only = await service.key_for(org_id, ("write",))
    async with service.mcp(write_only) as mcp:
        assert await mcp.error("search", query="x") == "Forbidden: missing scope read"


async def test_a_missing_scope_is_refused_before_the_input_is_read(service: Service) -> None:
    """403 / `Forbidden: missing scope` whatever the body or arguments: a key learns nothing
    about the input of a call it may not make, not even whether it would be valid."""
    org_id, writer = await service.org_with_key()
    reader = await service.key_for(org_id, ("read",))
    write_only = await service.key_for(org_id, ("write",))
    cid = "conv_" + "0" * 26
    invalid_writes = [
        ("POST", "/api/v1/conversations", {"title": 5}),
        ("POST", "/api/v1/messages", {"messages": []}),
        ("PATCH", f"/api/v1/conversations/{cid}/messages/msg_x", {"content": 5}),
        ("DELETE", "/api/v1/conversations/not-an-id", None),
    ]
    async with service.rest(reader) as http:
        for method, path, body in invalid_writes:
            r = await http.request(method, path, json=body)
            assert r.status_code == 403, (path, r.text)
            assert r.json() == {"error": "Forbidden: missing scope write", "code": "forbidden"}
        r = await http.post(
            "/api/v1/messages", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 403
        r = await http.post("/api/v1/messages", content=b"x" * (5 * 1024 * 1024))
        assert r.status_code == 403
        r = await http.get("/api/v1/search", params={"q": "x", "limit": 0})
        assert r.status_code == 400  # the key may search: its input is checked
    async with service.rest(write_only) as http:
        r = await http.get("/api/v1/search", params={"limit": "many"})
        assert r.status_code == 403
        assert r.json() == {"error": "Forbidden: missing scope read", "code": "forbidden"}
    async with service.mcp(reader) as mcp:
        assert await mcp.error("append_messages", messages=[]) == "Forbidden: missing scope write"
        assert (
            await mcp.error("create_conversation", title=5, unknown=1)
            == "Forbidden: missing scope write"
        )
    async with service.mcp(write_only) as mcp:
        assert await mcp.error("search", limit=0) == "Forbidden: missing scope read"
    async with service.mcp(writer) as mcp:
        assert (await mcp.error("search", limit=0)).startswith("Invalid arguments")


@pytest.mark.parametrize("interface", ["rest", "mcp"])
async def test_org_b_never_sees_org_a(service: Service, interface: str) -> None:
    _, key_a = await service.org_with_key()
    _, key_b = await service.org_with_key()
    async with service.rest(key_a) as http:
        cid = (await http.post("/api/v1/conversations", json={"tags": ["t"]})).json()[
            "conversation_id"
        ]
        mid = (
            await http.post(
                "/api/v1/messages",
                json={
                    "conversation_id": cid,
                    "messages": [{"role": "user", "content": "secret plan about zeppelins"}],
                },
            )
        ).json()["message_ids"][0]

    if interface == "rest":
        async with service.rest(key_b) as http:
            for method, path, body in [
                ("GET", f"/api/v1/conversations/{cid}", None),
                ("DELETE", f"/api/v1/conversations/{cid}", None),
                (
                    "POST",
                    "/api/v1/messages",
                    {"conversation_id": cid, "messages": [{"role": "user", "content": "x"}]},
                ),
                ("PATCH", f"/api/v1/conversations/{cid}/messages/{mid}", {"content": "x"}),
                ("GET", f"/api/v1/search?q=zeppelins&conversation_id={cid}", None),
            ]:
                r = await http.request(method, path, json=body)
                assert r.status_code == 404, path
                assert r.json()["error"] == "Conversation not found"
            listed = (await http.get("/api/v1/conversations?tags=t")).json()
            assert listed == {"conversations": [], "total": 0}
            found = (await http.get("/api/v1/search", params={"q": "secret plan zeppelins"})).json()
            assert found == {"results": [], "total": 0}
    else:
        async with service.mcp(key_b) as mcp:
            for tool, arguments in [
                ("get_conversation", {"conversation_id": cid}),
                ("delete_conversation", {"conversation_id": cid}),
                (
                    "append_messages",
                    {"conversation_id": cid, "messages": [{"role": "user", "content": "x"}]},
                ),
                ("search", {"query": "zeppelins", "conversation_id": cid}),
            ]:
                assert await mcp.error(tool, **arguments) == "Conversation not found"
            assert await mcp.ok("list_conversations") == {"conversations": [], "total": 0}
            assert await mcp.ok("search", query="secret plan zeppelins") == {
                "results": [],
                "total": 0,
            }

    async with service.rest(key_a) as http:  # A's data is untouched
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert [m["content"] for m in got["messages"]] == ["secret plan about zeppelins"]


async def test_failed_authentication_is_throttled_per_client(database_url: str) -> None:
    """Past the limit of unknown keys, a client's keys are not looked up: it gets 401 with
    Retry-After, except for keys that have authenticated before, so one client guessing keys
    behind a shared address does not lock out those already using theirs. Expired and
    revoked keys are real keys and do not count."""
    async with running_service(database_url, auth_failures_per_minute=3) as service:
        _, known = await service.org_with_key()
        _, unused = await service.org_with_key()
        _, revoked = await service.org_with_key()
        await service.revoke_key(revoked)
        async with httpx.AsyncClient(base_url=service.base_url) as http:

            async def status(key: str) -> int:
                headers = {"Authorization": f"Bearer {key}"}
                return (await http.get("/api/v1/usage", headers=headers)).status_code

            assert await status(known) == 200
            assert [await status(revoked) for _ in range(4)] == [403] * 4
            assert [await status("cmk_guess") for _ in range(3)] == [401] * 3
            r = await http.get("/api/v1/usage", headers={"Authorization": "Bearer cmk_guess"})
            assert r.status_code == 401 and int(r.headers["Retry-After"]) >= 1
            assert "too many failed authentication attempts" in r.json()["error"]
            r = await http.get("/api/v1/usage", headers={"Authorization": f"Bearer {unused}"})
            assert r.status_code == 401 and "Retry-After" in r.headers  # not looked up
            assert await status(known) == 200


async def test_concurrent_guesses_are_throttled_like_sequential_ones(database_url: str) -> None:
    """Guesses sent at once are looked up no more than the limit allows, while a burst of
    requests with one valid key, new to the process, all pass, and so do more distinct valid
    keys at once than the limit (they wait their turn)."""
    async with running_service(database_url, auth_failures_per_minute=3) as service:
        _, fresh = await service.org_with_key()
        async with httpx.AsyncClient(base_url=service.base_url, timeout=30) as http:

            async def get(key: str) -> httpx.Response:
                headers = {"Authorization": f"Bearer {key}"}
                return await http.get("/api/v1/usage", headers=headers)

            burst = await asyncio.gather(*(get(fresh) for _ in range(20)))
            assert [r.status_code for r in burst] == [200] * 20
            others = [(await service.org_with_key())[1] for _ in range(40)]
            at_once = await asyncio.gather(*(get(k) for k in others))  # a gateway's clients
            assert [r.status_code for r in at_once] == [200] * 40
            guesses = await asyncio.gather(*(get(f"cmk_guess{i}") for i in range(40)))
            assert {r.status_code for r in guesses} == {401}
            looked_up = [r for r in guesses if "Retry-After" not in r.headers]
            assert 1 <= len(looked_up) <= 3, len(looked_up)
