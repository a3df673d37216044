-- Chunks keep one unique index, the primary key that upsert_chunks' ON CONFLICT names.
-- ON CONFLICT resolves conflicts on that index only: with chunks_id unique too, a window
-- rebuilt while the indexer stored the same row's vector was refused with a unique violation
-- (seen at 370k chunks under load). chunk_id is derived from the key (ids.chunk_id), so it
-- stays unique without an index of its own enforcing it.
DROP INDEX chunks_id;
CREATE INDEX chunks_id ON chunks (org_id, chunk_id);

-- chunks_pending was never read by any query, and as an index over `embedding` it made every
-- store of a chunk's vector rewrite all of the chunk's index entries (no HOT update).
DROP INDEX chunks_pending;

-- Vectors do not compress: store them out of line without trying.
ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE EXTERNAL;
