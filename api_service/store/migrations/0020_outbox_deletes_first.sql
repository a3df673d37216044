-- The indexer leases due delete jobs before upserts, so a deleted conversation's vectors leave
-- the shards at once, not behind a backlog of embeddings (hours of them with the model on a
-- CPU). Deletes are few: this index finds them without reading the upserts.
CREATE INDEX index_outbox_deletes ON index_outbox (job_id) WHERE kind = 'delete';
