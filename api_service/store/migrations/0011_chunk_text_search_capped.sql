-- The chunk full-text trigger (0008) parses a window's text for a writer that gives no full
-- text: on insert, and on an update that changes the text but not the full text. A window
-- too large to join its messages' full text gets that of its first 64k characters
-- (repository.upsert_chunks), which a rebuild of the window can leave unchanged: the trigger
-- then parsed the whole window, more than one tsvector holds, and the append failed. It now
-- parses the window's first 64k characters, as upsert_chunks does.
CREATE OR REPLACE FUNCTION chunk_text_search() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.text_search IS NULL THEN
        NEW.text_search := to_tsvector('english', left(NEW.text, 64000));
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.text IS DISTINCT FROM OLD.text
           AND NEW.text_search IS NOT DISTINCT FROM OLD.text_search THEN
            NEW.text_search := to_tsvector('english', left(NEW.text, 64000));
        END IF;
    END IF;
    RETURN NEW;
END $$;
