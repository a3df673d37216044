-- The chunk full-text trigger (0008) parsed a window's whole text for writers from before
-- 0008, which gave none: on insert, and on an update that changed the text but not the full
-- text. Every writer since gives the full text, and an update of a window can rightly leave
-- it unchanged: a window too large to join its messages' full text gets that of its first
-- 64k characters (repository.upsert_chunks), which a rebuild may not change. The trigger
-- then parsed the whole window, more than one tsvector holds, and the append failed. It now
-- parses only a full text a writer leaves NULL, and at most the window's first 64k
-- characters.
CREATE OR REPLACE FUNCTION chunk_text_search() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.text_search IS NULL THEN
        NEW.text_search := to_tsvector('english', left(NEW.text, 64000));
    END IF;
    RETURN NEW;
END $$;
