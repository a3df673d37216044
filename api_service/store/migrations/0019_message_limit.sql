-- A plan also limits an org's messages. Stored bytes count what a client sends, but each
-- message also costs the service a row, a share of a window's chunk and its vector, in
-- PostgreSQL and in the shard's memory, whatever its size: without this limit, empty
-- messages cost an org nothing against its plan. Kept on the org row, beside its bytes and
-- conversations, by the same conditional UPDATE that charges them.
--
-- orgs before plans, the order in which a key's lookup reads them: the other order could
-- deadlock with a lookup holding orgs and waiting for plans. ALTER TABLE holds every writer
-- off the org rows until this commits, as 0018's lock did, so the sums below count every
-- write that has charged its org.
ALTER TABLE orgs ADD COLUMN message_count bigint NOT NULL DEFAULT 0;

ALTER TABLE plans
    ADD COLUMN max_messages bigint NOT NULL DEFAULT 10000000 CHECK (max_messages >= 0);

UPDATE orgs o
   SET message_count = t.messages
  FROM (SELECT org_id, sum(message_count) AS messages FROM conversations GROUP BY org_id) t
 WHERE t.org_id = o.org_id;
