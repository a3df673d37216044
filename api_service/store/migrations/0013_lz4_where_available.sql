-- Conversation text compresses with lz4 where the server has it (PostgreSQL 14 or later built
-- with lz4: the usual packages and managed services; the embedded server has pglz only).
-- pglz was the top function in the profile of an org's growth (9% of the machine): it
-- compresses a window's text and tries its full text, which hardly compresses, in every row
-- (0010). With lz4, writing a LongMemEval window's row took 46 us instead of 151, a
-- message's 9.7 instead of 20.0, and reading a window's text back 14 us instead of 28, for
-- 5% more disk (benchmarks/store/compression.py, PostgreSQL 15). Values stored before keep
-- their method until rewritten; both read back the same. Only the catalog changes: no table is rewritten.
-- A dump of this schema restores only on a server with lz4 unless pg_dump is given
-- --no-toast-compression.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_settings
                WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE messages
            ALTER COLUMN content SET COMPRESSION lz4,
            ALTER COLUMN metadata SET COMPRESSION lz4;
        ALTER TABLE chunks
            ALTER COLUMN text SET COMPRESSION lz4,
            ALTER COLUMN text_search SET COMPRESSION lz4;
        ALTER TABLE chunk_vectors ALTER COLUMN embedding SET COMPRESSION lz4;
        ALTER TABLE conversations ALTER COLUMN metadata SET COMPRESSION lz4;
    END IF;
END $$;
