"""Lexical search: chunks ranked by BM25 (k1 = 1.2, b = 0.75) over PostgreSQL full text.

Words are stemmed as the chunks were ('english'); a chunk's length is its count of distinct
words. Two plans, by the size of what is searched, both in the SQL function `lexical_search`
(as migration 0017 last made it; one BM25 statement ranks for both), so a search is one
round trip:

- Exact, while the scope (the org, or the conversations a search is narrowed to) holds fewer
  than EXACT_BELOW chunks, or the org has no term statistics yet: every chunk in scope that
  holds a query word is scored, with document frequencies counted in that scope (at most
  EXACT_CAP matches are scored: the cap bounds a common word's cost).
- Org-wide in any larger scope: document frequencies come from `lexeme_df`, refreshed in the
  background as the org grows. The search matches on its rarest words, as many as fit
  MATCH_BUDGET chunks by those frequencies (in a scope of conversations, by its share of the
  org's chunks), and scores every query word on those matches, so a query of common words
  stays cheap and a rare word decides what is found. When even the rarest word is common, it
  first matches the chunks that hold both of the two rarest words: BM25's likeliest winners,
  where a LIMIT over one common word's chunks would take any. A scope of conversations is
  then matched on any query word, as the org's rarest may be in none of its chunks.

`benchmarks/lexical` measures the org-wide plan against exact BM25 by budget: at 100k chunks
it finds 0.80 of the exact top 10 in 4.9 ms p50 (6.7 ms on PostgreSQL 15 with its default
settings), where matching on the rarest words alone found 0.79 with a budget of 500, in 12 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

from api_service.store.db import Conn

EXACT_CAP = 500
# A scope whose chunks the cap could not all score is searched on the org's term statistics:
# the cap scores any EXACT_CAP matches, and most questions match most of a small org. In orgs
# of 1k-5k chunks (s150 questions, benchmarks/lexical --capped) it found 0.71-0.20 of the
# exact top 10 in 5-6 ms, where the org-wide plan finds 0.95-0.74 in 2-2.5 ms; within 5 and
# 30 conversations of a 30k org (--scoped), 0.92 and 0.44 in 5.4 and 8.5 ms against 0.94 and
# 0.80 in 2.9 and 3.0 ms.
EXACT_BELOW = EXACT_CAP
MATCH_BUDGET = 200
# Term statistics are recounted once the org's chunk count has grown or shrunk by a factor of
# (1 + STATS_DRIFT) since they were taken. Each recount reads the whole org, so over its growth
# the recounts read about (1 + 1 / STATS_DRIFT) times its final size: at 0.25 they were 5% of
# the machine while an org grew from 20k to 45k chunks. Recounting at each doubling changes little:
# BM25 weighs a word by the share of the org's chunks that hold it, which an org growing alike
# keeps.
STATS_DRIFT = 1.0
# The GIN index over the chunks' full text. New entries go to its pending list, which every
# search through the index reads in full, and an insert that finds the list past
# gin_pending_list_limit (4 MB) moves it into the index itself: at 1M chunks that held an
# append up for 0.3-0.6 s (docs/performance.md). The indexer moves it in the background.
FULL_TEXT_INDEX = "chunks_text_search"


async def search(
    conn: Conn,
    org_id: str,
    query: str,
    limit: int,
    conversation_ids: Sequence[str] | None,
    budget: int = MATCH_BUDGET,
    *,
    exact_below: int = EXACT_BELOW,
    exact_cap: int = EXACT_CAP,
) -> list[str]:
    """Ids of the best `limit` chunks for `query`, within the given conversations if any, in one
    round trip (the SQL function `lexical_search`). `budget`, `exact_below` and
    `exact_cap`: MATCH_BUDGET, EXACT_BELOW and EXACT_CAP above."""
    rows = await conn.fetch(
        "SELECT chunk_id FROM lexical_search($1, $2, $3, $4, $5, $6, $7) AS chunk_id",
        org_id,
        query,
        limit,
        None if conversation_ids is None else list(conversation_ids),
        budget,
        exact_below,
        exact_cap,
    )
    return [r["chunk_id"] for r in rows]


async def chunk_count(conn: Conn, org_id: str) -> int:
    """The org's chunk count from its conversations' message counts (the SQL function
    `org_chunk_count`, migration 0015, which the exact plan counts its scope with)."""
    return int(await conn.fetchval("SELECT org_chunk_count($1, NULL)", org_id))


async def stats_chunk_count(conn: Conn, org_id: str) -> int | None:
    """The chunk count the org's term statistics were taken at, or None if never."""
    count = await conn.fetchval("SELECT chunks FROM lexical_stats WHERE org_id = $1", org_id)
    return None if count is None else int(count)


async def keep_stats(conn: Conn, org_id: str) -> bool:
    """Recount a large org's term statistics if they have drifted; drop a small org's. False
    if a recount was due and could not start (`refresh_stats`): try again later."""
    count = await chunk_count(conn, org_id)
    taken = await stats_chunk_count(conn, org_id)
    if count < EXACT_BELOW:
        if taken is not None:
            await conn.execute("DELETE FROM lexical_stats WHERE org_id = $1", org_id)  # cascades
    elif taken is None or stats_drifted(count, taken):
        return await refresh_stats(conn, org_id)
    return True


def stats_drifted(count: int, taken: int) -> bool:
    """Whether an org of `count` chunks needs the term statistics taken at `taken` recounted."""
    return not taken / (1 + STATS_DRIFT) <= count <= taken * (1 + STATS_DRIFT)


# The lock a recount holds on its org's statistics, and a delete shares.
_STATS_LOCK = "hashtextextended('lexical_stats:' || $1, 0)"


async def refresh_stats(conn: Conn, org_id: str) -> bool:
    """Recount the org's term statistics; False if another replica or a delete is at them."""
    async with conn.transaction():
        if not await conn.fetchval(f"SELECT pg_try_advisory_xact_lock({_STATS_LOCK})", org_id):
            return False
        # The stats row first: the lexeme counts reference it (0007_lexeme_df_parent.sql).
        await conn.execute(
            """INSERT INTO lexical_stats (org_id, chunks, avg_length)
               SELECT $1, count(*), 0 FROM chunks WHERE org_id = $1
               ON CONFLICT (org_id) DO UPDATE
                  SET chunks = excluded.chunks, refreshed_at = now()""",
            org_id,
        )
        await conn.execute("DELETE FROM lexeme_df WHERE org_id = $1", org_id)
        # ts_stat takes its rows from a query text: the org id goes in as a quoted literal.
        await conn.execute(
            """INSERT INTO lexeme_df (org_id, lexeme, df)
               SELECT $1, word, ndoc FROM ts_stat(format(
                   'SELECT text_search FROM chunks WHERE org_id = %L', $1::text))""",
            org_id,
        )
        # A chunk's length is its count of distinct lexemes, so the lengths sum to the dfs.
        await conn.execute(
            """UPDATE lexical_stats
                  SET avg_length = coalesce((SELECT sum(df) FROM lexeme_df WHERE org_id = $1), 0)
                                   / greatest(chunks, 1)
                WHERE org_id = $1""",
            org_id,
        )
    return True


async def forget_conversation(conn: Conn, org_id: str, conversation_id: str) -> None:
    """Take a conversation's chunks out of the org's term statistics, in the transaction that
    deletes it, so that a word only it held is gone from `lexeme_df` too. It waits for a
    recount under way (which counted the conversation) and keeps another from starting until
    the delete commits."""
    await conn.execute(f"SELECT pg_advisory_xact_lock_shared({_STATS_LOCK})", org_id)
    # Words whose count falls to nothing go; the others are counted down. The two statements
    # of one touch separate rows, as PostgreSQL requires.
    await conn.execute(
        """WITH gone AS (
               SELECT word.lexeme, count(*) AS chunks
                 FROM chunks c, unnest(c.text_search) AS word
                WHERE c.org_id = $1 AND c.conversation_id = $2
                  -- An org without statistics (under EXACT_BELOW chunks) reads nothing.
                  AND EXISTS (SELECT 1 FROM lexical_stats s WHERE s.org_id = $1)
                GROUP BY word.lexeme),
           dropped AS (
               DELETE FROM lexeme_df d USING gone
                WHERE d.org_id = $1 AND d.lexeme = gone.lexeme AND d.df <= gone.chunks)
           UPDATE lexeme_df d SET df = d.df - gone.chunks
             FROM gone
            WHERE d.org_id = $1 AND d.lexeme = gone.lexeme AND d.df > gone.chunks""",
        org_id,
        conversation_id,
    )


async def flush_pending(conn: Conn) -> int:
    """Move the full-text index's pending entries into the index; returns the pages emptied,
    0 when another replica is at it (a second flush would wait for the first, holding a
    connection, then find the list empty). The service's role must own the index, as it does
    the tables it migrates."""
    pages = await conn.fetchval(
        """SELECT CASE WHEN pg_try_advisory_xact_lock(hashtextextended('full_text_flush', 0))
                       THEN gin_clean_pending_list($1::regclass) ELSE 0 END""",
        FULL_TEXT_INDEX,
    )
    return int(pages)
