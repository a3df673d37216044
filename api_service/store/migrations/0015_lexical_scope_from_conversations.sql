-- An org's chunk count, or that of some of its conversations, from their message counts: a
-- window starts at every third message. lexical.chunk_count asks it, and so does the exact
-- plan of lexical_search for BM25's N, which counted the chunk rows in its scope. A chunk
-- row holds the window's full text, about two to a page: in an org of 3,792 chunks the count
-- read 1,944 pages and took 5 ms of a 17 ms search on a 2-core Xeon.
CREATE FUNCTION org_chunk_count(p_org text, p_conversations text[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum((message_count + 2) / 3), 0)::bigint FROM conversations
     WHERE org_id = p_org AND (p_conversations IS NULL OR conversation_id = ANY(p_conversations))
$$;

-- lexical_search as 0004 made it, but for its scope's count.
CREATE OR REPLACE FUNCTION lexical_search(
    p_org text,
    p_query text,
    p_limit integer,
    p_conversations text[],   -- NULL: org-wide
    p_budget integer,         -- the org-wide plan's match budget
    p_exact_below integer,    -- orgs with fewer chunks are searched exactly
    p_exact_cap integer       -- the exact plan scores at most this many matches
) RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_indexscan = off
AS $fn$
DECLARE
    lexemes text[];
    quoted text[];
    dfs double precision[];
    n double precision;
    avgdl double precision;
    matches text[];
    match text;
    covered double precision;
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

    -- Exact: every chunk in scope holding a query word (at most p_exact_cap), with document
    -- frequencies counted in that scope.
    IF p_conversations IS NOT NULL OR n IS NULL OR n < p_exact_below THEN
        RETURN QUERY EXECUTE $q$
            WITH matches AS MATERIALIZED (
                SELECT c.chunk_id, length(c.text_search)::float8 AS dl,
                       ts_filter(setweight(c.text_search, 'A', $4), '{a}') AS words
                  FROM chunks c
                 WHERE c.org_id = $1 AND c.text_search @@ to_tsquery('simple', $3)
                   AND ($5::text[] IS NULL OR c.conversation_id = ANY($5))
                 LIMIT $6),
            tf AS (
                SELECT m.chunk_id, m.dl, u.lexeme,
                       coalesce(array_length(u.positions, 1), 1)::float8 AS tf
                  FROM matches m, unnest(m.words) AS u(lexeme, positions, weights)),
            df AS (SELECT lexeme, count(*)::float8 AS v FROM tf GROUP BY lexeme),
            -- Materialized: a subquery pulled up would count again in every row's score.
            scope AS MATERIALIZED (SELECT org_chunk_count($1, $5)::float8 AS n),
            lengths AS (SELECT greatest(avg(dl), 1) AS avgdl FROM matches)
            SELECT tf.chunk_id
              FROM tf JOIN df USING (lexeme), scope, lengths
             GROUP BY tf.chunk_id
             ORDER BY sum(ln(1 + (n - df.v + 0.5) / (df.v + 0.5))
                          * tf.tf * 2.2 / (tf.tf + 1.2 * (0.25 + 0.75 * tf.dl / avgdl))) DESC,
                      tf.chunk_id
             LIMIT $2$q$
            USING p_org, p_limit, array_to_string(quoted, ' | '), lexemes, p_conversations,
                  p_exact_cap;
        RETURN;
    END IF;

    -- Org-wide: match on the rarest words that fit the budget; when even the rarest is more
    -- common than that, first on the chunks holding both of the two rarest, then the rarest
    -- alone. Every query word is scored on the matches, with the org's term statistics.
    IF dfs[1] > p_budget AND cardinality(lexemes) > 1 THEN
        matches := ARRAY[quoted[1] || ' & ' || quoted[2], quoted[1]];
    ELSE
        match := quoted[1];
        covered := dfs[1];
        FOR i IN 2 .. cardinality(lexemes) LOOP
            covered := covered + dfs[i];
            EXIT WHEN covered > p_budget;
            match := match || ' | ' || quoted[i];
        END LOOP;
        matches := ARRAY[match];
    END IF;
    FOREACH match IN ARRAY matches LOOP
        -- `c.org_id || ''` keeps the planner off the org's key index.
        FOR id IN EXECUTE $q$
            WITH matches AS MATERIALIZED (
                SELECT c.chunk_id, length(c.text_search)::float8 AS dl,
                       ts_filter(setweight(c.text_search, 'A', $4), '{a}') AS words
                  FROM chunks c
                 WHERE c.org_id || '' = $1 AND c.text_search @@ to_tsquery('simple', $3)
                 LIMIT $6),
            tf AS (
                SELECT m.chunk_id, m.dl, u.lexeme,
                       coalesce(array_length(u.positions, 1), 1)::float8 AS tf
                  FROM matches m, unnest(m.words) AS u(lexeme, positions, weights)),
            df AS (SELECT * FROM unnest($4, $5) AS df(lexeme, v))
            SELECT tf.chunk_id
              FROM tf JOIN df USING (lexeme)
             GROUP BY tf.chunk_id
             ORDER BY sum(ln(1 + ($7 - df.v + 0.5) / (df.v + 0.5))
                          * tf.tf * 2.2 / (tf.tf + 1.2 * (0.25 + 0.75 * tf.dl / $8))) DESC,
                      tf.chunk_id
             LIMIT $2$q$
            USING p_org, p_limit, match, lexemes, dfs, p_budget, n, greatest(avgdl, 1)
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
