-- lexical_search as 0016 made it, but for two things:
-- - Its two plans are ranked by one BM25 statement. They differed only in where a word's
--   document frequency, the chunk count N and the average length come from (counted on the
--   matches in scope, or the org's term statistics) and in the org filter; those are now
--   the statement's parameters and fixed fragments.
-- - A large scope of conversations is found through the chunks' key with the org in it: the
--   org-wide plan hid the org from the planner, which then read the whole key index to find
--   the conversations' chunks.
CREATE OR REPLACE FUNCTION lexical_search(
    p_org text,
    p_query text,
    p_limit integer,
    p_conversations text[],   -- NULL: org-wide
    p_budget integer,         -- the org-wide plan's match budget
    p_exact_below integer,    -- scopes of fewer chunks are searched exactly
    p_exact_cap integer       -- the exact plan scores at most this many matches
) RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_indexscan = off
AS $fn$
DECLARE
    -- BM25 over at most $6 chunks of org $1 matching the tsquery $3 (within conversations
    -- $9 if given), scoring the query's lexemes $4. %1$s: the org filter; %2$s: the lexemes'
    -- document frequencies (lexeme, v). $7: N; $8: the average length, else the matches'.
    ranking constant text := $q$
        WITH matches AS MATERIALIZED (
            SELECT c.chunk_id, length(c.text_search)::float8 AS dl,
                   ts_filter(setweight(c.text_search, 'A', $4), '{a}') AS words
              FROM chunks c
             WHERE %1$s = $1 AND c.text_search @@ to_tsquery('simple', $3)
               AND ($9::text[] IS NULL OR c.conversation_id = ANY($9))
             LIMIT $6),
        tf AS (
            SELECT m.chunk_id, m.dl, u.lexeme,
                   coalesce(array_length(u.positions, 1), 1)::float8 AS tf
              FROM matches m, unnest(m.words) AS u(lexeme, positions, weights)),
        df AS (%2$s),
        lengths AS (SELECT coalesce($8, greatest(avg(dl), 1)) AS avgdl FROM matches)
        SELECT tf.chunk_id
          FROM tf JOIN df USING (lexeme), lengths
         GROUP BY tf.chunk_id
         ORDER BY sum(ln(1 + ($7 - df.v + 0.5) / (df.v + 0.5))
                      * tf.tf * 2.2 / (tf.tf + 1.2 * (0.25 + 0.75 * tf.dl / lengths.avgdl)))
                  DESC, tf.chunk_id
         LIMIT $2$q$;
    counted_in_scope constant text :=
        'SELECT lexeme, count(*)::float8 AS v FROM tf GROUP BY lexeme';
    org_statistics constant text := 'SELECT * FROM unnest($4, $5) AS df(lexeme, v)';
    statement text;
    lexemes text[];
    quoted text[];
    dfs double precision[];
    n double precision;
    scope_n double precision;     -- chunks in scope: the org's, or the conversations'
    bm25_n double precision;      -- N: the chunks the document frequencies were counted in
    any_word text;
    avgdl double precision;
    cap integer;                  -- matches scored, per tsquery
    matches text[];               -- tsqueries, tried in order until p_limit are found
    match text;
    covered double precision;
    share double precision;       -- of the org's chunks in scope
    found text[] := '{}';
    id text;
BEGIN
    -- The query's lexemes, rarest first, with their document frequencies in the org.
    SELECT array_agg(t.lexeme ORDER BY coalesce(d.df, 0), t.lexeme),
           array_agg(quote_literal(t.lexeme) ORDER BY coalesce(d.df, 0), t.lexeme),
           array_agg(coalesce(d.df, 0)::float8 ORDER BY coalesce(d.df, 0), t.lexeme),
           max(s.chunks)::float8, max(s.avg_length)
      INTO lexemes, quoted, dfs, n, avgdl
      FROM unnest(tsvector_to_array(to_tsvector('english', p_query))) AS t(lexeme)
      LEFT JOIN lexeme_df d ON d.org_id = p_org AND d.lexeme = t.lexeme
      LEFT JOIN lexical_stats s ON s.org_id = p_org;
    IF lexemes IS NULL THEN
        RETURN;  -- stop words only
    END IF;
    any_word := array_to_string(quoted, ' | ');
    IF p_conversations IS NULL AND n >= p_exact_below THEN
        scope_n := n;
    ELSE
        scope_n := org_chunk_count(p_org, p_conversations);
    END IF;

    IF n IS NULL OR scope_n < p_exact_below THEN
        -- Exact, while the scope (the org, or the conversations) has fewer chunks than
        -- p_exact_below or the org has no term statistics: every chunk in scope holding a
        -- query word (at most p_exact_cap), with document frequencies and lengths counted on
        -- them and N the scope's chunk count.
        matches := ARRAY[any_word];
        cap := p_exact_cap;
        bm25_n := scope_n;
        avgdl := NULL;
        statement := format(ranking, 'c.org_id', counted_in_scope);
    ELSE
        -- Org-wide: match on the rarest words that fit the budget; when even the rarest is
        -- more common than that, first on the chunks holding both of the two rarest, then the
        -- rarest alone. Every query word is scored on the matches, with the org's term
        -- statistics. A large scope of conversations is searched the same way within it, a
        -- word expected in its share of the org's chunks that hold it, and then on any query
        -- word: the org's rarest words may be in none of the scope's chunks. Org-wide the
        -- share is 1.
        share := least(scope_n / greatest(n, 1), 1);
        IF dfs[1] * share > p_budget AND cardinality(lexemes) > 1 THEN
            matches := ARRAY[quoted[1] || ' & ' || quoted[2], quoted[1]];
        ELSE
            match := quoted[1];
            covered := dfs[1] * share;
            FOR i IN 2 .. cardinality(lexemes) LOOP
                covered := covered + dfs[i] * share;
                EXIT WHEN covered > p_budget;
                match := match || ' | ' || quoted[i];
            END LOOP;
            matches := ARRAY[match];
        END IF;
        IF p_conversations IS NOT NULL AND NOT any_word = ANY(matches) THEN
            matches := matches || any_word;
        END IF;
        cap := p_budget;
        bm25_n := n;
        avgdl := greatest(avgdl, 1);
        -- Org-wide, `c.org_id || ''` keeps the planner off the org's key index, every chunk's
        -- entry in it. A scope of conversations takes the key to their chunks alone, where it
        -- read the whole index for the conversations' column without the org's (30 of a
        -- 38 ms search on PostgreSQL's default settings).
        statement := format(
            ranking,
            CASE WHEN p_conversations IS NULL THEN 'c.org_id || ''''' ELSE 'c.org_id' END,
            org_statistics);
    END IF;

    FOREACH match IN ARRAY matches LOOP
        FOR id IN EXECUTE statement
            USING p_org, p_limit, match, lexemes, dfs, cap, bm25_n, avgdl, p_conversations
        LOOP
            CONTINUE WHEN id = ANY(found);
            found := found || id;
            RETURN NEXT id;
            EXIT WHEN cardinality(found) >= p_limit;
        END LOOP;
        EXIT WHEN cardinality(found) >= p_limit;
    END LOOP;
END
$fn$;
