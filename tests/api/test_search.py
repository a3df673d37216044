"""Search over the real stack (hashing embedder): indexing on append, exact filters, clipping,
PATCH and delete reflected, and appends that outlive an embed_service outage."""

from __future__ import annotations

import random
from collections.abc import Callable

import asyncpg
import httpx
import pytest

from tests.api.harness import Service, outbox_drained, running_service, say


async def _conversation(http: httpx.AsyncClient, texts: list[str], **body: object) -> str:
    cid = (await http.post("/api/v1/conversations", json=body)).json()["conversation_id"]
    r = await http.post(
        "/api/v1/messages",
        json={"conversation_id": cid, "messages": [{"role": "user", "content": t} for t in texts]},
    )
    assert r.status_code == 200, r.text
    return str(cid)


async def test_append_then_search_finds_it_on_both_interfaces(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        await _conversation(http, ["the weather in Oslo was cold and rainy"])
        target = await _conversation(
            http, ["my passport number ends in 4471", "renewal is due in June"]
        )
        found = await mcp.ok("search", query="when is my passport renewal due")
        assert found["results"][0]["conversation_id"] == target
        scores = [r["score"] for r in found["results"]]
        assert scores == sorted(scores, reverse=True)
        rest = (await http.get("/api/v1/search", params={"q": "passport renewal"})).json()
        assert rest["results"][0]["conversation_id"] == target
        assert rest["total"] == len(rest["results"])
        # REST's score is the fused rank's: 1/(60 + rank) from each ranking that holds it.
        fused = [r["score"] for r in rest["results"]]
        assert fused == sorted(fused, reverse=True)
        top = round(2 / 61, 6)  # scores are rounded to 6 places
        assert fused[0] == top and all(0 < f <= top for f in fused)


async def test_conversation_filter_returns_its_full_k(service: Service, key: str) -> None:
    """A conversation whose chunks rank low for the query still fills the limit when it is the
    filter: filters narrow the candidates before ranking."""
    async with service.rest(key) as http, service.mcp(key) as mcp:
        for _ in range(3):
            await _conversation(http, [f"rocket engine thrust test {i}" for i in range(12)])
        weak = await _conversation(
            http, [f"gardening note {i} about rocket salad" for i in range(12)]
        )
        unfiltered = await mcp.ok("search", query="rocket engine thrust test", limit=4)
        assert all(r["conversation_id"] != weak for r in unfiltered["results"])
        filtered = await mcp.ok(
            "search", query="rocket engine thrust test", limit=4, conversation_id=weak
        )
        assert filtered["total"] == 4
        assert {r["conversation_id"] for r in filtered["results"]} == {weak}


async def test_tag_and_project_filters(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        a = await _conversation(
            http, ["invoice 88 was paid"], tags=["billing", "eu"], metadata={"project": "atlas"}
        )
        b = await _conversation(
            http, ["invoice 91 was paid"], tags=["billing"], metadata={"project": "zephyr"}
        )
        both = await mcp.ok("search", query="invoice paid", tags=["billing"])
        assert {r["conversation_id"] for r in both["results"]} == {a, b}
        only_a = await mcp.ok("search", query="invoice paid", tags=["billing", "eu"])
        assert {r["conversation_id"] for r in only_a["results"]} == {a}
        none = await mcp.ok("search", query="invoice paid", tags=["nothing-has-this"])
        assert none == {"results": [], "total": 0}
        by_project = (
            await http.get("/api/v1/search", params={"q": "invoice paid", "project": "zephyr"})
        ).json()
        assert {r["conversation_id"] for r in by_project["results"]} == {b}
        mcp_project = await mcp.ok("search", query="invoice paid", project="atlas")
        assert {r["conversation_id"] for r in mcp_project["results"]} == {a}
        unknown = await mcp.ok("search", query="invoice paid", project="no-such-project")
        assert unknown == {"results": [], "total": 0}
        by_tags = (
            await http.get("/api/v1/search", params={"q": "invoice paid", "tags": "billing,eu"})
        ).json()
        assert {r["conversation_id"] for r in by_tags["results"]} == {a}


async def test_snippet_clipping(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = await _conversation(http, ["lighthouse " * 300])
        full = (await mcp.ok("search", query="lighthouse", snippet_chars=5000))["results"][0]
        assert full["chunk_text"] == "[user]: " + "lighthouse " * 300
        clipped = (await mcp.ok("search", query="lighthouse", snippet_chars=100))["results"][0]
        assert len(clipped["chunk_text"]) == 100
        assert clipped["chunk_text"].endswith("...[truncated]")
        assert clipped["chunk_text"].startswith("[user]: lighthouse")
        default = (
            await http.get("/api/v1/search", params={"q": "lighthouse", "conversation_id": cid})
        ).json()
        assert len(default["results"][0]["chunk_text"]) == 1500


async def test_windows_of_five_with_stride_three(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = await _conversation(http, [f"note{i}" for i in range(1, 8)])
        hits = (await mcp.ok("search", query="note1 note4 note7", limit=10, conversation_id=cid))[
            "results"
        ]
        spans = sorted((h["start_sequence"], h["end_sequence"]) for h in hits)
        assert spans == [(1, 5), (4, 7), (7, 7)]
        first = next(h for h in hits if h["start_sequence"] == 1)
        assert first["chunk_text"] == "\n".join(f"[user]: note{i}" for i in range(1, 6))


async def test_patch_and_delete_are_reflected(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        cid = await _conversation(http, ["the spare key is under the blue flowerpot"])
        mid = (await http.get(f"/api/v1/conversations/{cid}")).json()["messages"][0]["id"]
        r = await http.patch(
            f"/api/v1/conversations/{cid}/messages/{mid}",
            json={"content": "the spare key is with the neighbour Maria"},
        )
        assert r.status_code == 200
        hits = await mcp.ok("search", query="where is the spare key", conversation_id=cid)
        new_text = "[user]: the spare key is with the neighbour Maria"
        assert hits["results"][0]["chunk_text"] == new_text
        old = await mcp.ok("search", query="blue flowerpot")
        assert all("flowerpot" not in h["chunk_text"] for h in old["results"])

        await http.delete(f"/api/v1/conversations/{cid}")
        await outbox_drained(service.database_url)  # vector removal goes through the outbox
        gone = await mcp.ok("search", query="spare key neighbour Maria")
        assert all(h["conversation_id"] != cid for h in gone["results"])


async def test_a_hit_whose_row_is_gone_gives_its_place_to_the_next(
    service: Service, key: str
) -> None:
    """A chunk deleted after the index ranked it (its removal still in the outbox) is skipped,
    and the search still fills its limit with the next ranked chunks, in order."""
    async with service.rest(key) as http, service.mcp(key) as mcp:
        for t, topic in enumerate(("sourdough starter", "rye sourdough", "sourdough oven")):
            # A count of "crumb" of its own in every window: no two chunks score alike.
            await _conversation(http, [f"{topic} " + "crumb " * (i + 10 * t) for i in range(9)])
        ranked = (await mcp.ok("search", query="sourdough starter crumb", limit=5))["results"]
        assert len(ranked) == 5
        gone = [h["chunk_id"] for h in ranked[:2]]
        conn = await asyncpg.connect(service.database_url)
        try:  # rows only: the shard keeps both vectors
            await conn.execute("DELETE FROM chunks WHERE chunk_id = ANY($1::text[])", gone)
        finally:
            await conn.close()
        vector = (await mcp.ok("search", query="sourdough starter crumb", limit=3))["results"]
        assert [h["chunk_id"] for h in vector] == [h["chunk_id"] for h in ranked[2:]]
        r = await http.get("/api/v1/search", params={"q": "sourdough starter crumb", "limit": 3})
        hybrid = r.json()["results"]  # the vector half still ranks the deleted rows first
        assert len(hybrid) == 3 and not {h["chunk_id"] for h in hybrid} & set(gone)
        assert [h["score"] for h in hybrid] == sorted((h["score"] for h in hybrid), reverse=True)
        assert "rows" in r.headers["server-timing"]


async def test_appends_survive_an_embed_outage(database_url: str) -> None:
    async with running_service(database_url, append_index_wait_seconds=0.3) as service:
        _, key = await service.org_with_key()
        async with service.rest(key) as http:
            await service.stop_embed()
            cid = await _conversation(http, [f"outage message {i}" for i in range(10)])
            got = (await http.get(f"/api/v1/conversations/{cid}")).json()
            assert got["conversation"]["message_count"] == 10  # committed despite the outage
            assert await service.outbox_size() == 1
            r = await http.get("/api/v1/search", params={"q": "outage"})
            assert r.status_code == 503 and r.json()["code"] == "unavailable"

            await service.start_embed()
            await outbox_drained(service.database_url)
            found = (
                await http.get(
                    "/api/v1/search",
                    params={"q": "outage message", "conversation_id": cid, "limit": 10},
                )
            ).json()
            assert sorted(h["start_sequence"] for h in found["results"]) == [1, 4, 7, 10]


def _cjk_word(rng: random.Random) -> str:
    return "".join(chr(rng.randrange(0x4E00, 0xA000)) for _ in range(6))


def _hyphenated_word(rng: random.Random) -> str:  # indexed whole and by each part
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "-".join("".join(rng.choice(letters) for _ in range(4)) for _ in range(2))


@pytest.mark.parametrize("word", [_cjk_word, _hyphenated_word])
async def test_a_window_of_the_largest_messages_is_stored_with_its_full_text(
    service: Service, key: str, word: Callable[[random.Random], str]
) -> None:
    """Five messages at the content limit, of distinct CJK words or of hyphenated ones, hold
    more full text than one tsvector can (1 MB). Appended one by one, their window joins
    their full text while it fits, then parses its first 64k characters instead; each
    rebuild of the window, with that same full text, goes through, and the conversation goes
    on growing."""
    rng = random.Random(7)

    def message() -> str:
        return " ".join(word(rng) for _ in range(20_000))[:100_000]

    texts = [message() for _ in range(5)]
    first_word = texts[0].split(" ")[0]
    async with service.rest(key) as http:
        cid = (await http.post("/api/v1/conversations")).json()["conversation_id"]
        for text in [*texts, "and more"]:
            r = await say(http, cid, text)
            assert r.status_code == 200, r.text
    conn = await asyncpg.connect(service.database_url)
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM chunks WHERE conversation_id = $1 AND start_sequence = 1 "
            "AND text_search @@ plainto_tsquery('english', $2)",
            cid,
            first_word,
        )
        assert found == 1
    finally:
        await conn.close()


async def test_errors_name_the_query_as_each_interface_does(service: Service, key: str) -> None:
    async with service.rest(key) as http, service.mcp(key) as mcp:
        r = await http.get("/api/v1/search", params={"q": "  "})
        assert r.status_code == 400 and r.json()["error"] == "q must not be empty"
        r = await http.get("/api/v1/search", params={"q": "x" * 4001})
        assert r.status_code == 400 and r.json()["error"].startswith("q is longer than 4000")
        assert await mcp.error("search", query="  ") == "query must not be empty"
