"""Lexical search: chunks ranked by BM25 (k1 = 1.2, b = 0.75) over PostgreSQL full text.

Words are stemmed as the chunks were ('english'); a chunk's length is its count of distinct
words. Two plans, by the size of what is searched:

- Exact, for a search narrowed to some conversations and for orgs under EXACT_BELOW chunks:
  every chunk in scope that holds a query word is scored, with document frequencies counted in
  that scope (at most EXACT_CAP matches are scored: the cap bounds a common word's cost).
- Org-wide in a large org: document frequencies come from `lexeme_df`, refreshed in the
  background as the org grows. The search matches on its rarest words, as many as fit
  MATCH_BUDGET chunks by those frequencies, and scores every query word on those matches, so
  a query of common words stays cheap and a rare word decides what is found. When even the
  rarest word is common, it first matches the chunks that hold both of the two rarest words:
  BM25's likeliest winners, where a LIMIT over one common word's chunks would take any.

`benchmarks/lexical` measures the org-wide plan against exact BM25 by budget: at 100k chunks
it finds 0.80 of the exact top 10 in 7.5 ms p50, where matching on the rarest words alone
found 0.79 with a budget of 500, in 12 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncpg import Record

from api_service import timing
from api_service.store.db import Conn

EXACT_BELOW = 5_000
EXACT_CAP = 500
MATCH_BUDGET = 200
# Term statistics are recounted once the org's chunk count has moved this far from the count
# they were taken at; document frequencies that far off change BM25's word weights little.
STATS_DRIFT = 0.1

# A generic plan cannot see the words to match on, and a LIMIT over matches makes a scan of the
# whole table or of the org's rows look cheap; either would read every chunk's tsvector instead
# of the full-text index's matches.
PLAN_SETTINGS = (
    "SET LOCAL plan_cache_mode = force_custom_plan; "
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off"
)

# A matched chunk's length (dl) and its query words with their positions (setweight marks
# them, ts_filter keeps them) are taken in the MATERIALIZED CTE that finds it: each reads the
# chunk's tsvector once, and the rest of the query works on the small filtered vectors.
_MATCHED = """c.chunk_id, length(c.text_search)::float8 AS dl,
           ts_filter(setweight(c.text_search, 'A', $4::text[]), '{a}') AS words"""

_TF = """tf AS (
    SELECT m.chunk_id, m.dl, u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf
      FROM matches m, unnest(m.words) AS u(lexeme, positions, weights))"""

_BM25 = """sum(ln(1 + (n - df.v + 0.5) / (df.v + 0.5))
              * tf.tf * 2.2 / (tf.tf + 1.2 * (0.25 + 0.75 * tf.dl / avgdl)))"""

# Both: $1 org, $2 limit, $3 the tsquery text of the words to match on, $4 all query lexemes;
# exact: $5 the conversations or NULL, $6 the match cap; org-wide: $5 the lexemes' document
# frequencies, $6 the match cap, $7 the org's chunk count, $8 its average chunk length. The
# tsquery is a parameter, not derived in SQL, so the planner sees it and picks its index.
_EXACT = f"""WITH matches AS MATERIALIZED (
        SELECT {_MATCHED}
          FROM chunks c
         WHERE c.org_id = $1 AND c.text_search @@ to_tsquery('simple', $3)
           AND ($5::text[] IS NULL OR c.conversation_id = ANY($5::text[]))
         LIMIT $6),
    {_TF},
    df AS (SELECT lexeme, count(*)::float8 AS v FROM tf GROUP BY lexeme),
    scope AS (
        SELECT count(*)::float8 AS n FROM chunks c
         WHERE c.org_id = $1 AND ($5::text[] IS NULL OR c.conversation_id = ANY($5::text[]))),
    lengths AS (
        SELECT greatest(avg(dl), 1) AS avgdl FROM matches)
SELECT tf.chunk_id
  FROM tf JOIN df USING (lexeme), scope, lengths
 GROUP BY tf.chunk_id
 ORDER BY {_BM25} DESC, tf.chunk_id
 LIMIT $2"""

# `c.org_id || ''` keeps the planner off the org's key index: with statistics that lag a
# growing org it would read every chunk of the org instead of the rare words' postings.
_ORG_WIDE = f"""WITH matches AS MATERIALIZED (
        SELECT {_MATCHED}
          FROM chunks c
         WHERE c.org_id || '' = $1 AND c.text_search @@ to_tsquery('simple', $3)
         LIMIT $6),
    {_TF},
    df AS (SELECT * FROM unnest($4::text[], $5::float8[]) AS df(lexeme, v)),
    stats AS (SELECT $7::float8 AS n, $8::float8 AS avgdl)
SELECT tf.chunk_id
  FROM tf JOIN df USING (lexeme), stats
 GROUP BY tf.chunk_id
 ORDER BY {_BM25} DESC, tf.chunk_id
 LIMIT $2"""


async def search(
    conn: Conn,
    org_id: str,
    query: str,
    limit: int,
    conversation_ids: Sequence[str] | None,
    budget: int = MATCH_BUDGET,
) -> list[str]:
    """Ids of the best `limit` chunks for `query`, within the given conversations if any;
    `budget`: the org-wide plan's MATCH_BUDGET."""
    with timing.part("lexical"):
        return await _search(conn, org_id, query, limit, conversation_ids, budget)


async def _search(
    conn: Conn,
    org_id: str,
    query: str,
    limit: int,
    conversation_ids: Sequence[str] | None,
    budget: int,
) -> list[str]:
    async with conn.transaction():
        await conn.execute(PLAN_SETTINGS)
        terms = await query_terms(conn, org_id, query)
        if not terms:
            return []
        lexemes = [t["lexeme"] for t in terms]
        stats = terms[0]
        if conversation_ids is not None or stats["chunks"] is None or stats["chunks"] < EXACT_BELOW:
            rows = await conn.fetch(
                _EXACT,
                org_id,
                limit,
                " | ".join(t["quoted"] for t in terms),
                lexemes,
                None if conversation_ids is None else list(conversation_ids),
                EXACT_CAP,
            )
        else:
            found: list[str] = []
            dfs = [float(t["df"]) for t in terms]
            for match in match_queries(terms, budget):
                rows = await conn.fetch(
                    _ORG_WIDE,
                    org_id,
                    limit,
                    match,
                    lexemes,
                    dfs,
                    budget,
                    float(stats["chunks"]),
                    max(float(stats["avg_length"]), 1.0),
                )
                found += [r["chunk_id"] for r in rows if r["chunk_id"] not in found]
                if len(found) >= limit:
                    return found[:limit]
            return found
        return [r["chunk_id"] for r in rows]


async def query_terms(conn: Conn, org_id: str, query: str) -> list[Record]:
    """The query's lexemes, rarest first, each with its `quoted` form and its `df` in the org,
    and the org's term statistics (`chunks`, `avg_length`; NULL if never counted) on every
    row: one round trip."""
    return await conn.fetch(
        """SELECT t.lexeme, quote_literal(t.lexeme) AS quoted, coalesce(d.df, 0) AS df,
                  s.chunks, s.avg_length
             FROM unnest(tsvector_to_array(to_tsvector('english', $2))) AS t(lexeme)
             LEFT JOIN lexeme_df d ON d.org_id = $1 AND d.lexeme = t.lexeme
             LEFT JOIN lexical_stats s ON s.org_id = $1
            ORDER BY df, t.lexeme""",
        org_id,
        query,
    )


def match_queries(terms: Sequence[Record], budget: int = MATCH_BUDGET) -> list[str]:
    """The tsqueries an org-wide search matches on, in order, until enough are found (the
    matches of a later one rank after those of an earlier one). Either the rarest terms that
    fit the budget; or, when even the rarest is more common than that, the chunks holding both
    of the two rarest, then the rarest alone."""
    if terms[0]["df"] > budget and len(terms) > 1:
        return [f"{terms[0]['quoted']} & {terms[1]['quoted']}", terms[0]["quoted"]]
    return [rarest_fitting(terms, budget)]


def rarest_fitting(terms: Sequence[Record], budget: int) -> str:
    """The tsquery of the rarest terms (`query_terms` order) whose chunks together fit
    `budget`; at least one."""
    chosen = [terms[0]["quoted"]]
    covered = terms[0]["df"]
    for term in terms[1:]:
        covered += term["df"]
        if covered > budget:
            break
        chosen.append(term["quoted"])
    return " | ".join(chosen)


async def chunk_count(conn: Conn, org_id: str) -> int:
    """The org's chunk count from its conversations' message counts: one window starts at
    every third message."""
    count = await conn.fetchval(
        "SELECT coalesce(sum((message_count + 2) / 3), 0) FROM conversations WHERE org_id = $1",
        org_id,
    )
    return int(count)


async def stats_chunk_count(conn: Conn, org_id: str) -> int | None:
    """The chunk count the org's term statistics were taken at, or None if never."""
    count = await conn.fetchval("SELECT chunks FROM lexical_stats WHERE org_id = $1", org_id)
    return None if count is None else int(count)


async def keep_stats(conn: Conn, org_id: str) -> None:
    """Recount a large org's term statistics if they have drifted; drop a small org's."""
    count = await chunk_count(conn, org_id)
    taken = await stats_chunk_count(conn, org_id)
    if count < EXACT_BELOW:
        if taken is not None:
            await conn.execute("DELETE FROM lexical_stats WHERE org_id = $1", org_id)
            await conn.execute("DELETE FROM lexeme_df WHERE org_id = $1", org_id)
    elif taken is None or abs(count - taken) > STATS_DRIFT * taken:
        await refresh_stats(conn, org_id)


async def refresh_stats(conn: Conn, org_id: str) -> bool:
    """Recount the org's term statistics; False if another replica is doing it right now."""
    async with conn.transaction():
        if not await conn.fetchval(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('lexical_stats:' || $1, 0))",
            org_id,
        ):
            return False
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
            """INSERT INTO lexical_stats (org_id, chunks, avg_length)
               SELECT $1, n, coalesce((SELECT sum(df) FROM lexeme_df WHERE org_id = $1), 0)
                             / greatest(n, 1)
                 FROM (SELECT count(*) AS n FROM chunks WHERE org_id = $1) c
               ON CONFLICT (org_id) DO UPDATE
                  SET chunks = excluded.chunks, avg_length = excluded.avg_length,
                      refreshed_at = now()""",
            org_id,
        )
    return True
