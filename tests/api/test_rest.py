"""Every REST endpoint against the real service: shapes, defaults, bounds and status codes."""

from __future__ import annotations

import asyncio
import math
import re
import time

import asyncpg
import pytest

from api_service import main, timing
from api_service.clients import EmbedClient
from api_service.indexer import Backlog
from tests.api.harness import Service, outbox_gauges

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


async def _create(http, **body) -> str:  # type: ignore[no-untyped-def]
    r = await http.post("/api/v1/conversations", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["conversation_id"])


async def test_create_takes_no_body_as_an_empty_one(service: Service, key: str) -> None:
    """Every field of a new conversation is optional, so the body may be left out."""
    async with service.rest(key) as http:
        r = await http.post("/api/v1/conversations")
        assert r.status_code == 201, r.text
        cid = r.json()["conversation_id"]
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()["conversation"]
        assert (got["title"], got["tags"], got["metadata"]) == (None, [], {})


async def test_metadata_keeps_the_text_of_a_nul_escape(service: Service, key: str) -> None:
    """The text `\\u0000` is not a NUL: stored and returned as sent."""
    metadata = {"path": "C:\\u0000\\logs", "\\u0000": "key"}
    async with service.rest(key) as http:
        cid = await _create(http, metadata=metadata)
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()["conversation"]
    assert got["metadata"] == metadata


async def test_create_append_get(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        r = await http.post(
            "/api/v1/conversations",
            json={
                "title": "Trip",
                "agent_id": "agent-1",
                "tags": ["travel", "q3"],
                "metadata": {"project": "alpha", "n": 1},
            },
        )
        assert r.status_code == 201
        assert set(r.json()) == {"conversation_id"}
        cid = r.json()["conversation_id"]
        assert cid.startswith("conv_")

        r = await http.post(
            "/api/v1/messages",
            json={
                "conversation_id": cid,
                "messages": [
                    {"role": "user", "content": "Book a flight to Lisbon"},
                    {
                        "role": "assistant",
                        "content": "Searching",
                        "tool_call_id": "call_1",
                        "tool_name": "flights",
                        "metadata": {"k": "v"},
                    },
                ],
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"appended", "message_ids"}  # as MCP's append_messages answers
        assert body["appended"] == 2 and len(body["message_ids"]) == 2
        assert all(m.startswith("msg_") for m in body["message_ids"])

        r = await http.get(f"/api/v1/conversations/{cid}")
        assert r.status_code == 200
        got = r.json()
        conv = got["conversation"]
        assert conv["id"] == cid and conv["title"] == "Trip" and conv["agent_id"] == "agent-1"
        assert conv["tags"] == ["travel", "q3"] and conv["metadata"] == {"project": "alpha", "n": 1}
        assert conv["message_count"] == 2
        assert ISO_Z.match(conv["created_at"]) and ISO_Z.match(conv["updated_at"])
        assert conv["updated_at"] >= conv["created_at"]
        first, second = got["messages"]
        assert [first["sequence"], second["sequence"]] == [1, 2]
        assert first["id"] == body["message_ids"][0] and first["role"] == "user"
        assert first["content"] == "Book a flight to Lisbon" and ISO_Z.match(first["created_at"])
        assert second["tool_call_id"] == "call_1" and second["tool_name"] == "flights"
        assert second["metadata"] == {"k": "v"} and first["tool_name"] is None


async def test_get_paginates_messages_in_sequence_order(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        cid = await _create(http)
        await http.post(
            "/api/v1/messages",
            json={
                "conversation_id": cid,
                "messages": [{"role": "user", "content": f"m{i}"} for i in range(1, 13)],
            },
        )
        r = await http.get(
            f"/api/v1/conversations/{cid}", params={"message_limit": 5, "message_offset": 4}
        )
        assert [m["sequence"] for m in r.json()["messages"]] == [5, 6, 7, 8, 9]
        assert next(m["content"] for m in r.json()["messages"]) == "m5"
        r = await http.get(f"/api/v1/conversations/{cid}")
        assert len(r.json()["messages"]) == 12  # default limit 100
        for params in (
            {"message_limit": 0},
            {"message_limit": 501},
            {"message_offset": -1},
            {"message_limit": "ten"},
        ):
            r = await http.get(f"/api/v1/conversations/{cid}", params=params)
            assert r.status_code == 400, params
            assert set(r.json()) == {"error", "code"}
            assert next(iter(params)) in r.json()["error"]


async def test_list_filters_sorts_orders_and_pages(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        ids = []
        for i, (agent, tags, n) in enumerate(
            [("a", ["x", "y"], 3), ("b", ["x"], 1), ("a", ["y"], 2), ("a", [], 5)]
        ):
            cid = await _create(http, title=f"c{i}", agent_id=agent, tags=tags)
            await http.post(
                "/api/v1/messages",
                json={"conversation_id": cid, "messages": [{"role": "user", "content": "hi"}] * n},
            )
            ids.append(cid)

        r = await http.get("/api/v1/conversations")
        body = r.json()
        assert body["total"] == 4
        assert [c["id"] for c in body["conversations"]] == ids[::-1]  # updated_at desc
        summary = body["conversations"][0]
        assert set(summary) == {"id", "title", "agent_id", "tags", "message_count", "updated_at"}

        r = await http.get(
            "/api/v1/conversations", params={"sort": "message_count", "order": "asc"}
        )
        assert [c["message_count"] for c in r.json()["conversations"]] == [1, 2, 3, 5]
        r = await http.get("/api/v1/conversations", params={"sort": "created_at", "order": "asc"})
        assert [c["id"] for c in r.json()["conversations"]] == ids
        r = await http.get("/api/v1/conversations", params={"agent_id": "a"})
        assert r.json()["total"] == 3
        r = await http.get("/api/v1/conversations", params={"tags": "x,y"})
        assert [c["id"] for c in r.json()["conversations"]] == [ids[0]]
        r = await http.get("/api/v1/conversations", params={"tags": "x", "agent_id": "b"})
        assert [c["id"] for c in r.json()["conversations"]] == [ids[1]]
        r = await http.get(
            "/api/v1/conversations",
            params={"sort": "created_at", "order": "asc", "limit": 2, "offset": 1},
        )
        assert [c["id"] for c in r.json()["conversations"]] == ids[1:3]
        assert r.json()["total"] == 4
        for params in (
            {"limit": 0},
            {"limit": 101},
            {"offset": -1},
            {"sort": "title"},
            {"order": "up"},
        ):
            r = await http.get("/api/v1/conversations", params=params)
            assert r.status_code == 400, params
            assert next(iter(params)) in r.json()["error"]


async def test_delete_removes_everything(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        cid = await _create(http)
        await http.post(
            "/api/v1/messages",
            json={
                "conversation_id": cid,
                "messages": [{"role": "user", "content": f"m{i}"} for i in range(7)],
            },
        )
        r = await http.delete(f"/api/v1/conversations/{cid}")
        assert r.status_code == 200 and r.json() == {"deleted": True}
        r = await http.get(f"/api/v1/conversations/{cid}")
        assert r.status_code == 404 and r.json()["error"] == "Conversation not found"
        r = await http.delete(f"/api/v1/conversations/{cid}")
        assert r.status_code == 404 and r.json() == {
            "error": "Conversation not found",
            "code": "not_found",
        }
    conn = await asyncpg.connect(service.database_url)
    try:
        for table in ("conversations", "messages", "chunks"):
            n = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE conversation_id = $1", cid)
            assert n == 0, table
    finally:
        await conn.close()


async def test_default_memory(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        r1 = await http.post(
            "/api/v1/messages", json={"messages": [{"role": "user", "content": "remember this"}]}
        )
        r2 = await http.post(
            "/api/v1/messages", json={"messages": [{"role": "user", "content": "and this"}]}
        )
        assert r1.status_code == r2.status_code == 200
        assert set(r1.json()) == {"appended", "message_ids", "conversation_id"}
        cid = r1.json()["conversation_id"]
        assert cid == r2.json()["conversation_id"]
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert got["conversation"]["title"] == "Default memory"
        assert got["conversation"]["metadata"] == {"default": True}
        assert [m["sequence"] for m in got["messages"]] == [1, 2]


async def test_patch_replaces_content_and_rebuilds_windows(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        cid = await _create(http)
        ids = (
            await http.post(
                "/api/v1/messages",
                json={
                    "conversation_id": cid,
                    "messages": [{"role": "user", "content": f"m{i}"} for i in range(1, 8)],
                },
            )
        ).json()["message_ids"]
        r = await http.patch(
            f"/api/v1/conversations/{cid}/messages/{ids[4]}", json={"content": "edited five"}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["updated"] is True
        assert body["message"]["id"] == ids[4] and body["message"]["sequence"] == 5
        assert body["message"]["content"] == "edited five"
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()["messages"]
        assert got[4]["content"] == "edited five" and got[3]["content"] == "m4"
        r = await http.patch(
            f"/api/v1/conversations/{cid}/messages/msg_nope", json={"content": "x"}
        )
        assert r.status_code == 404 and r.json()["error"] == "Message not found"
        r = await http.patch(
            f"/api/v1/conversations/conv_nope/messages/{ids[0]}", json={"content": "x"}
        )
        assert r.status_code == 404 and r.json()["error"] == "Conversation not found"
        r = await http.patch(f"/api/v1/conversations/{cid}/messages/{ids[0]}", json={})
        assert r.status_code == 400 and "content" in r.json()["error"]
    conn = await asyncpg.connect(service.database_url)
    try:
        texts = dict(
            await conn.fetch(
                "SELECT start_sequence, text FROM chunks WHERE conversation_id = $1", cid
            )
        )
        assert "[user]: edited five" in texts[1] and "[user]: edited five" in texts[4]
        assert "edited" not in texts[7]
    finally:
        await conn.close()


async def test_a_windows_full_text_is_its_messages(service: Service, key: str) -> None:
    """Windows take their full text from their messages' (parsed once each): the same lexemes,
    as often, as parsing the window's text, through batch and one-message appends and edits."""
    said = [
        f"The {w} quickly jumped over {i} lazy dogs, then ran home!"
        for i, w in enumerate(["fox", "cat", "plumber", "invoice", "garden", "quokka", "weather"])
    ]
    async with service.rest(key) as http:
        cid = await _create(http)
        batch = [{"role": "user", "content": c} for c in said[:5]]
        r = await http.post("/api/v1/messages", json={"conversation_id": cid, "messages": batch})
        ids = r.json()["message_ids"]
        for content in said[5:]:
            message = {"role": "assistant", "content": content}
            r = await http.post(
                "/api/v1/messages", json={"conversation_id": cid, "messages": [message]}
            )
            assert r.status_code == 200, r.text
        r = await http.patch(
            f"/api/v1/conversations/{cid}/messages/{ids[3]}", json={"content": "tea at noon"}
        )
        assert r.status_code == 200, r.text
    conn = await asyncpg.connect(service.database_url)
    try:
        counts = """SELECT array_agg(lexeme || ':' || array_length(positions, 1) ORDER BY lexeme)
                      FROM unnest({})"""
        rows = await conn.fetch(
            f"""SELECT ({counts.format("text_search")}) AS stored,
                       ({counts.format("to_tsvector('english', text)")}) AS parsed
                  FROM chunks WHERE conversation_id = $1 ORDER BY start_sequence""",
            cid,
        )
        assert len(rows) == 3
        for row in rows:
            assert row["stored"] is not None and row["stored"] == row["parsed"]
        # The edited message is the 4th: in the windows starting at 1 and 4, not 7.
        assert ["noon:1" in row["stored"] for row in rows] == [True, True, False]
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": []}, "messages"),
        ({"conversation_id": "x"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user"}]}, "content"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": "x" * 100_001}]}, "content"),
        ({"messages": [{"role": "user", "content": "a\u0000b"}]}, "NUL"),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "extra"),
        ({"messages": [{"role": "user", "content": "x"}] * 501}, "500"),
        (
            {"messages": [{"role": "user", "content": "x", "metadata": {"k": "v" * 17_000}}]},
            "metadata",
        ),
    ],
)
async def test_bad_append_is_400_and_stores_nothing(
    service: Service,
    key: str,
    body: dict,
    needle: str,  # type: ignore[type-arg]
) -> None:
    async with service.rest(key) as http:
        cid = await _create(http)
        body = {"conversation_id": cid, **body} if "conversation_id" not in body else body
        r = await http.post("/api/v1/messages", json=body)
        assert r.status_code in (400, 404), r.text
        if r.status_code == 400:
            assert needle in r.json()["error"] and r.json()["code"] == "invalid_request"
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()
        assert got["conversation"]["message_count"] == 0 and got["messages"] == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"title": "x" * 513}, "title"),
        ({"tags": ["ok", "not ok"]}, "tags"),
        ({"tags": [f"t{i}" for i in range(33)]}, "tags"),
        ({"tags": "x"}, "tags"),
        ({"metadata": [1, 2]}, "metadata"),
        ({"title": 5}, "title"),
        ({"unknown": 1}, "unknown"),
    ],
)
async def test_bad_create_is_400_and_stores_nothing(
    service: Service,
    key: str,
    body: dict,
    needle: str,  # type: ignore[type-arg]
) -> None:
    async with service.rest(key) as http:
        r = await http.post("/api/v1/conversations", json=body)
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]
        assert (await http.get("/api/v1/conversations")).json()["total"] == 0


async def test_malformed_json_and_oversize_body(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        r = await http.post(
            "/api/v1/conversations",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400 and r.json() == {
            "error": "Request body is not valid JSON",
            "code": "invalid_request",
        }
        r = await http.post(
            "/api/v1/messages",
            content=b"x" * (4 * 1024 * 1024 + 1),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        assert (await http.get("/api/v1/conversations")).json()["total"] == 0


async def test_search_validates_its_parameters(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        for params, needle in (
            ({}, "q"),
            ({"q": ""}, "q"),
            ({"q": "x", "limit": 0}, "limit"),
            ({"q": "x", "limit": 51}, "limit"),
            ({"q": "x", "snippet_chars": 5001}, "snippet_chars"),
        ):
            r = await http.get("/api/v1/search", params=params)
            assert r.status_code == 400 and needle in r.json()["error"], params
        r = await http.get("/api/v1/search", params={"q": "x", "conversation_id": "conv_nope"})
        assert r.status_code == 404 and r.json()["error"] == "Conversation not found"
        r = await http.get("/api/v1/search", params={"q": "anything"})
        assert r.status_code == 200 and r.json() == {"results": [], "total": 0}


async def test_a_tag_filter_is_taken_as_written(service: Service, key: str) -> None:
    """An empty or padded tag in a comma list is refused as MCP refuses it, never dropped (which
    would widen the filter) or trimmed; an empty parameter is no filter."""
    async with service.rest(key) as http:
        cid = await _create(http, tags=["travel"])
        for path, params in (("/api/v1/conversations", {}), ("/api/v1/search", {"q": "x"})):
            for tags in (",", " ", "travel,,x", " travel", "travel,"):
                r = await http.get(path, params={**params, "tags": tags})
                assert r.status_code == 400, (path, tags, r.text)
                assert r.json()["error"].startswith("tags: each tag is 1 to 64 characters")
        r = await http.get("/api/v1/conversations", params={"tags": ""})
        assert [c["id"] for c in r.json()["conversations"]] == [cid]
        r = await http.get("/api/v1/conversations", params={"tags": "travel,x"})
        assert r.json()["conversations"] == []


async def test_an_unexpected_error_keeps_the_rest_headers(service: Service, key: str) -> None:
    """A failure no handler expects is a 500 in the error shape, and still carries the
    request's X-RateLimit and Server-Timing headers."""
    conn = await asyncpg.connect(service.database_url)
    try:
        await conn.execute(
            "CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'refused by a test trigger'; END$$"
        )
        await conn.execute(
            "CREATE OR REPLACE TRIGGER test_refuse BEFORE INSERT ON conversations FOR EACH ROW "
            "WHEN (NEW.title = 'refuse me') EXECUTE FUNCTION test_refuse()"
        )
        async with service.rest(key) as http:
            r = await http.post("/api/v1/conversations", json={"title": "refuse me"})
            assert r.status_code == 500, r.text
            assert r.json() == {"error": "Internal error", "code": "internal_error"}
            assert "x-ratelimit-remaining" in r.headers and "server-timing" in r.headers
            assert "refused by a test trigger" not in r.text
            assert (await http.get("/api/v1/conversations")).json()["total"] == 0
    finally:
        await conn.execute("DROP TRIGGER IF EXISTS test_refuse ON conversations")
        await conn.execute("DROP FUNCTION IF EXISTS test_refuse()")
        await conn.close()


async def test_unknown_query_parameters_are_400(service: Service, key: str) -> None:
    """As bodies refuse unknown fields: a misspelt parameter is named, never ignored, and a
    repeated one is refused rather than read as its last value."""
    async with service.rest(key) as http:
        for path, params in (
            ("/api/v1/search", {"q": "x", "limt": "5"}),
            ("/api/v1/conversations", {"limit": "5", "sort_by": "created_at"}),
            ("/api/v1/usage", {"month": "2026-01"}),
        ):
            r = await http.get(path, params=params)
            assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
            unknown = next(p for p in params if p in ("limt", "sort_by", "month"))
            assert r.json()["error"].split(" (")[0] == f"Unknown query parameter: {unknown}"
        r = await http.get("/api/v1/conversations", params={"limit": "5", "order": "asc"})
        assert r.status_code == 200, r.text
        r = await http.get("/api/v1/search", params=[("q", "x"), ("limit", "5"), ("limit", "50")])
        assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
        assert r.json()["error"].startswith("Query parameter given more than once: limit ")


async def test_unknown_paths_and_methods_answer_in_the_error_shape(
    service: Service, key: str
) -> None:
    """/mcp is served by its own route: under /api/v1 an unknown path is a JSON 404 and a
    known path asked with another method a JSON 405, as every REST error."""
    async with service.rest(key) as http:
        for method, path, status, code in (
            ("GET", "/api/v1/typo", 404, "not_found"),
            ("GET", "/api/v1/conversations/conv_x/typo", 404, "not_found"),
            ("PUT", "/api/v1/conversations", 405, "method_not_allowed"),
            ("GET", "/api/v1/messages", 405, "method_not_allowed"),
            ("POST", "/api/v1/search", 405, "method_not_allowed"),
        ):
            r = await http.request(method, path)
            assert r.status_code == status, (method, path, r.text)
            assert r.json()["code"] == code, (method, path, r.text)


async def test_operational_endpoints(service: Service, key: str) -> None:
    async with service.rest(None) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        r = await http.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["checks"]["postgres"] is True and r.json()["checks"]["embed"] is True
        await http.get("/api/v1/conversations")
    async with service.rest(key) as http:
        assert (await http.get("/api/v1/conversations/conv_nope")).status_code == 404
        metrics = (await http.get("/metrics")).text
    # Refused before routing: no route. Routed: the route's template, whole, never the path.
    assert 'memory_http_requests_total{method="GET",route="other",status="401"}' in metrics
    routed = 'route="/api/v1/conversations/{conversation_id}",status="404"}'
    assert f'memory_http_requests_total{{method="GET",{routed}' in metrics
    assert "conv_nope" not in metrics


async def test_metrics_answer_without_the_outbox_figures_when_its_read_hangs(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool with every connection taken, or a database that does not answer, leaves the
    outbox gauges empty (NaN) after OUTBOX_READ_SECONDS; the request metrics still come."""

    async def stuck(pool: asyncpg.Pool) -> None:
        await asyncio.sleep(60)

    monkeypatch.setattr(main, "outbox_backlog", stuck)
    async with service.rest(None) as http:
        await http.get("/healthz")
        started = time.monotonic()
        r = await http.get("/metrics")
        took = time.monotonic() - started
    assert r.status_code == 200
    assert main.OUTBOX_READ_SECONDS <= took < main.OUTBOX_READ_SECONDS + 3
    gauges = outbox_gauges(r.text)
    assert len(gauges) == 3 and all(math.isnan(value) for value in gauges.values())
    assert any(line.startswith("memory_http_requests_total{") for line in r.text.splitlines())


async def test_a_flood_of_keyless_probes_runs_one_check_at_a_time(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/metrics and /readyz take no key. Requests that come while a check runs share its
    result, so a flood of them does not take the database pool or load every shard."""
    calls = {"outbox": 0, "embed": 0}

    async def slow_backlog(pool: asyncpg.Pool) -> Backlog:
        calls["outbox"] += 1
        await asyncio.sleep(0.3)
        return Backlog(jobs=7, failing=1, oldest_seconds=2.0)

    ready = EmbedClient.ready

    async def slow_ready(self: EmbedClient) -> bool:
        calls["embed"] += 1
        await asyncio.sleep(0.3)
        return await ready(self)

    monkeypatch.setattr(main, "outbox_backlog", slow_backlog)
    monkeypatch.setattr(EmbedClient, "ready", slow_ready)
    async with service.rest(None) as http:
        metrics = await asyncio.gather(*(http.get("/metrics") for _ in range(20)))
        probes = await asyncio.gather(*(http.get("/readyz") for _ in range(20)))
        assert calls == {"outbox": 1, "embed": 1}
        assert all(outbox_gauges(r.text)["memory_index_outbox_jobs"] == 7 for r in metrics)
        assert all(r.status_code == 200 and r.json()["status"] == "ready" for r in probes)
        await http.get("/metrics")  # one that comes after runs a check of its own
        assert calls["outbox"] == 2


async def test_rest_responses_say_where_their_time_went(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        cid = await _create(http)
        r = await http.post(
            "/api/v1/messages",
            json={"conversation_id": cid, "messages": [{"role": "user", "content": "hello"}]},
        )
        assert r.status_code == 200, r.text
        append = timing.parse(r.headers["Server-Timing"])
        assert set(append) == {"auth", "write", "embed", "embed_wait", "vectors", "index", "total"}
        # The transaction, then the rest of the embedding, then storing the vectors, then the
        # upsert, one after the other.
        after_commit = append["embed_wait"] + append["vectors"] + append["index"]
        assert 0 < append["auth"] + append["write"] + after_commit <= append["total"]
        # The wait after the commit is at most the embedding call, plus the decoding of its
        # reply that follows the call (well under 0.1 ms).
        assert 0 <= append["embed_wait"] <= append["embed"] + 0.1

        r = await http.get("/api/v1/search", params={"q": "hello"})
        assert r.status_code == 200, r.text
        search = timing.parse(r.headers["Server-Timing"])
        assert set(search) == {"auth", "embed", "index", "lexical", "rows", "total"}
        # The two rankings run side by side, then the hits' rows are read.
        ranking = max(search["embed"] + search["index"], search["lexical"])
        assert 0 < ranking + search["rows"] <= search["total"]

        refused = await http.get("/api/v1/conversations/conv_doesnotexist")
        assert refused.status_code == 404
        assert set(timing.parse(refused.headers["Server-Timing"])) == {"auth", "total"}


async def test_non_finite_numbers_are_refused(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        for token in ("NaN", "Infinity", "-Infinity", "1e999"):
            r = await http.post(
                "/api/v1/conversations",
                content=f'{{"metadata": {{"n": {token}}}}}',
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 400, (token, r.text)
            assert "metadata" in r.json()["error"]
        assert (await http.get("/api/v1/conversations")).json()["total"] == 0


async def test_oversize_chunked_bodies_get_413_on_both_interfaces(
    service: Service, key: str
) -> None:
    async def chunks(total: int):  # type: ignore[no-untyped-def]
        yield b'{"title": "'
        for _ in range(total // 65536):
            yield b"x" * 65536
        yield b'"}'

    async with service.rest(key) as http:
        for path in ("/api/v1/conversations", "/mcp"):
            r = await http.post(
                path,
                content=chunks(5 * 1024 * 1024),
                headers={
                    "Content-Type": "application/json",
                    "Accept": "application/json, text/event-stream",
                },
            )
            assert r.status_code == 413, (path, r.text[:200])
            assert r.json()["code"] == "payload_too_large"
        r = await http.post(
            "/api/v1/conversations",
            content=chunks(1024 * 1024),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400 and "title" in r.json()["error"]  # read whole: 1 MiB title
        assert (await http.get("/api/v1/conversations")).json()["total"] == 0
