-- Chunk vectors get a table of their own. Stored in the chunk row, each vector was an UPDATE
-- moments after the insert: a second version of the row, a second write of its full text,
-- and (once rows are large) new entries in every index, the full-text GIN included. Inserted
-- here, a vector touches neither the chunk row nor its indexes, so the full text can live in
-- the row (below), where an org-wide lexical search reads it with the row instead of through
-- TOAST: at 1M chunks from disk, about half the time.
--
-- First, so the migration takes its strongest lock on chunks before the copy below rather than
-- raising it after (a lock upgrade can deadlock with a reader).
-- New full text stays in the chunk row (compressed first if the row is too large); rows
-- stored before keep theirs out of line until rewritten (VACUUM FULL chunks, in a
-- maintenance window). The ids stay in the row too: PostgreSQL moves a row's other
-- attributes out of line, largest first, while the row is over 2 KB, and a full text that
-- stays took the 28-byte chunk_id along. Every read of the id then went through TOAST: an
-- org-wide search at 100k chunks read 25,000 TOAST pages to group its matches by chunk.
-- The 30% left free on each page for the vector's UPDATE (0009) has no use left: a rebuild
-- changes the full text, which the GIN indexes, so it is never a HOT update.
ALTER TABLE chunks
    SET (fillfactor = 100),
    ALTER COLUMN text_search SET STORAGE MAIN,
    ALTER COLUMN org_id SET STORAGE MAIN,
    ALTER COLUMN conversation_id SET STORAGE MAIN,
    ALTER COLUMN chunk_id SET STORAGE MAIN;

-- A vector belongs to one version of its window: readers take it only while
-- chunk_vectors.version = chunks.version. A rebuilt window keeps its old vector here until
-- the new one is stored over it; a deleted chunk takes its vector along.
CREATE TABLE chunk_vectors (
    org_id           text NOT NULL,
    conversation_id  text NOT NULL,
    start_sequence   integer NOT NULL,
    version          integer NOT NULL,
    embedding        bytea NOT NULL,  -- little-endian float32 values
    PRIMARY KEY (org_id, conversation_id, start_sequence),
    FOREIGN KEY (org_id, conversation_id, start_sequence)
        REFERENCES chunks (org_id, conversation_id, start_sequence) ON DELETE CASCADE
);
-- In the row: out of line, each vector cost two more tuples and two TOAST index entries to
-- write. At 768 dimensions (3 KB) two fit a page, so a vector takes 4 KB of disk instead of
-- about 3.3. Model vectors do not compress; past the page they still go out of line.
ALTER TABLE chunk_vectors ALTER COLUMN embedding SET STORAGE MAIN;

INSERT INTO chunk_vectors (org_id, conversation_id, start_sequence, version, embedding)
SELECT org_id, conversation_id, start_sequence, version, embedding
  FROM chunks WHERE embedding IS NOT NULL;

-- chunks.embedding stays for one release, while pods of the previous one still run:
-- - they store vectors there (an UPDATE): the trigger copies each one here, with the row's
--   version, and leaves it there for the previous release's readers;
-- - they read it to skip embedding again, so a rebuilt window still clears it (upsert_chunks)
--   and an old pod never takes a stale vector for the new text.
-- Vectors this release stores are here only: rolling back past 0010 copies them back first
-- (docs/operations.md). The release after this one drops the column and the trigger.
CREATE FUNCTION chunk_vector_copied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.embedding IS NOT NULL THEN
        INSERT INTO chunk_vectors (org_id, conversation_id, start_sequence, version, embedding)
        VALUES (NEW.org_id, NEW.conversation_id, NEW.start_sequence, NEW.version,
                NEW.embedding)
        ON CONFLICT (org_id, conversation_id, start_sequence) DO UPDATE
           SET version = excluded.version, embedding = excluded.embedding
         WHERE chunk_vectors.version <= excluded.version;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chunk_vector_copied BEFORE UPDATE OF embedding ON chunks
    FOR EACH ROW EXECUTE FUNCTION chunk_vector_copied();
