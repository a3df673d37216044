-- An org's chunk count, or that of some of its conversations, from their message counts: a
-- window starts at every third message. lexical.chunk_count asks it, and so does
-- lexical_search (0016) for its scope's N, which the exact plan counted from the chunk rows
-- in its scope. A chunk row holds the window's full text, about two to a page: in an org of
-- 3,792 chunks the count read 1,944 pages and took 5 ms of a 17 ms search on a 2-core Xeon.
CREATE FUNCTION org_chunk_count(p_org text, p_conversations text[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum((message_count + 2) / 3), 0)::bigint FROM conversations
     WHERE org_id = p_org AND (p_conversations IS NULL OR conversation_id = ANY(p_conversations))
$$;
