-- Per-org totals for plan limits, kept in the same transactions as the writes they count, so
-- a write that would pass a limit is refused whole.
ALTER TABLE orgs
    ADD COLUMN storage_bytes      bigint NOT NULL DEFAULT 0,
    ADD COLUMN conversation_count bigint NOT NULL DEFAULT 0;

UPDATE orgs o
   SET storage_bytes = t.bytes, conversation_count = t.conversations
  FROM (SELECT org_id, sum(storage_bytes) AS bytes, count(*) AS conversations
          FROM conversations GROUP BY org_id) t
 WHERE t.org_id = o.org_id;
