"""Secrets never reach storage or the model: appends and edits are redacted before the write."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from api_service.core.redaction import Redactor
from tests.api.harness import Service

SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"


async def test_append_and_patch_store_redacted_text(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
        r = await http.post(
            "/api/v1/messages",
            json={
                "conversation_id": cid,
                "messages": [
                    {
                        "role": "user",
                        "content": f"my stripe key is {SECRET}",
                        "metadata": {"env": f"STRIPE={SECRET}"},
                    }
                ],
            },
        )
        mid = r.json()["message_ids"][0]
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()["messages"][0]
        assert got["content"] == "my stripe key is [REDACTED:stripe_key]"
        assert got["metadata"] == {"env": "STRIPE=[REDACTED:stripe_key]"}
        r = await http.patch(
            f"/api/v1/conversations/{cid}/messages/{mid}",
            json={"content": "card 4242 4242 4242 4242"},
        )
        assert r.json()["message"]["content"] == "card [REDACTED:card_number]"
    conn = await asyncpg.connect(service.database_url)
    try:
        for table, column in (
            ("messages", "content"),
            ("chunks", "text"),
            ("messages", "metadata::text"),
        ):
            leaked = await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE {column} LIKE '%4242 4242%' "
                f"OR {column} LIKE '%{SECRET}%'"
            )
            assert leaked == 0, table
    finally:
        await conn.close()


async def test_personal_data_redaction_is_per_org(service: Service) -> None:
    org_id, key = await service.org_with_key()
    _, other_key = await service.org_with_key()
    conn = await asyncpg.connect(service.database_url)
    try:
        await conn.execute("UPDATE orgs SET redact_pii = true WHERE org_id = $1", org_id)
    finally:
        await conn.close()
    text = "reach me at jo.doe@example.com"
    for api_key, expected in ((key, "reach me at [REDACTED:email]"), (other_key, text)):
        async with service.rest(api_key) as http:
            r = await http.post(
                "/api/v1/messages", json={"messages": [{"role": "user", "content": text}]}
            )
            cid = r.json()["conversation_id"]
            got = (await http.get(f"/api/v1/conversations/{cid}")).json()["messages"][0]
            assert got["content"] == expected


async def test_conversation_title_and_metadata_are_redacted(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        r = await http.post(
            "/api/v1/conversations",
            json={"title": f"deploy with {SECRET}", "metadata": {"keys": [f"k={SECRET}"]}},
        )
        cid = r.json()["conversation_id"]
        got = (await http.get(f"/api/v1/conversations/{cid}")).json()["conversation"]
        assert got["title"] == "deploy with [REDACTED:stripe_key]"
        assert got["metadata"] == {"keys": ["k=[REDACTED:stripe_key]"]}
    conn = await asyncpg.connect(service.database_url)
    try:
        leaked = await conn.fetchval(
            "SELECT count(*) FROM conversations WHERE title LIKE $1 OR metadata::text LIKE $1",
            f"%{SECRET}%",
        )
        assert leaked == 0
    finally:
        await conn.close()


HOSTILE = ("eyJa." * 20_000)[:100_000]  # a JWT's shape over and over: every match is checked
LARGE_BODIES = {  # each just under the 4 MiB body limit
    "content": [{"role": "user", "content": HOSTILE}] * 38,
    "metadata": [{"role": "user", "content": "x", "metadata": {"k": HOSTILE[:16_000]}}] * 250,
}


@pytest.mark.parametrize("where", LARGE_BODIES)
async def test_the_event_loop_keeps_turning_while_a_large_append_is_redacted(
    service: Service, key: str, where: str
) -> None:
    """Text made to be slow to redact fills the body, in content or in metadata, and its
    redaction takes seconds. It runs on a worker thread, so the event loop serves other
    requests meanwhile. The service shares this test's loop: a loop held by the redaction
    shows as a long gap between a sleeper's wake-ups."""
    messages = LARGE_BODIES[where]
    gaps: list[float] = []

    async def sleeper() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with service.rest(key) as http:
        cid = (await http.post("/api/v1/conversations", json={})).json()["conversation_id"]
        watch = asyncio.create_task(sleeper())
        r = await http.post("/api/v1/messages", json={"conversation_id": cid, "messages": messages})
        watch.cancel()
        assert r.status_code == 200, r.text
    t0 = time.perf_counter()
    Redactor().redact_value([m.get("metadata") or m["content"] for m in messages])
    redaction = time.perf_counter() - t0
    assert redaction > 0.5, "the text is too quick to redact here to tell"
    assert max(gaps) < redaction / 4, (max(gaps), redaction)
