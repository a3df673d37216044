-- chunks_pending was never read by any query, and as an index over `embedding` it made every
-- store of a chunk's vector rewrite all of the chunk's index entries (no HOT update).
DROP INDEX chunks_pending;

-- Vectors do not compress: store them out of line without trying.
ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE EXTERNAL;
