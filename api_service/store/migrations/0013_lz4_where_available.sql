-- Conversation text, metadata and (past about 2,000 dimensions) vectors compress with lz4
-- where the server has it (PostgreSQL 14 or later built with lz4: the usual packages and
-- managed services; the embedded server has pglz only). pglz compressing a window's text was
-- the top function in the profile of an org's growth (benchmarks/store/compression.py has
-- the figures). Values keep their method until they are stored again (VACUUM FULL does not
-- recompress); both read back the same.
--
-- Not the chunks' full text: pglz gives up on it (it saves under 25%), so it stays as it is
-- in the row, where an org-wide lexical search reads it for every match (0010). lz4 keeps
-- any saving, however small: most full texts were then stored compressed, for a few per
-- cent less space, and each match's read had to decompress one.
--
-- Only the catalog changes, but under each table's strongest lock: they are taken first, in
-- the order an append takes them (conversation, messages, chunks; the indexer's vectors
-- after), so an append of a pod still running cannot deadlock with the migration.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_settings
                WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        LOCK TABLE conversations, messages, chunks, chunk_vectors IN ACCESS EXCLUSIVE MODE;
        ALTER TABLE conversations ALTER COLUMN metadata SET COMPRESSION lz4;
        ALTER TABLE messages
            ALTER COLUMN content SET COMPRESSION lz4,
            ALTER COLUMN metadata SET COMPRESSION lz4;
        ALTER TABLE chunks ALTER COLUMN text SET COMPRESSION lz4;
        ALTER TABLE chunk_vectors ALTER COLUMN embedding SET COMPRESSION lz4;
    END IF;
END $$;
