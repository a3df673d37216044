"""Keys and tenants: 401/403 on both interfaces, scopes, and no view of another org's data."""

from __future__ import annotations

import httpx
import httpx2
import pytest

from tests.api.harness import Service, running_service

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
    async with running_service(database_url, auth_failures_per_minute=3) as service:
        _, key = await service.org_with_key()
        async with httpx.AsyncClient(base_url=service.base_url) as http:
            bad = {"Authorization": "Bearer cmk_guess"}
            statuses = [
                (await http.get("/api/v1/conversations", headers=bad)).status_code for _ in range(4)
            ]
            assert statuses == [401, 401, 401, 429]
            r = await http.get("/api/v1/conversations", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            assert "failed authentication" in r.json()["error"]
