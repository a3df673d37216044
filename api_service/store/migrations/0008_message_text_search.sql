-- Each message's full text is parsed once, when it is stored, and a window's full text is the
-- concatenation of its messages' (upsert_chunks). With to_tsvector over each window's text,
-- every message was parsed about twice (windows overlap) and a one-message append re-parsed
-- its whole window: the parse was PostgreSQL's largest cost while an org grew.
-- For plain text the concatenation holds the same lexemes with the same counts as to_tsvector
-- of the window's text; only positions differ (by stop words at a line's end), and no query
-- reads them. (The parser can read a `<...>` spanning two lines as a tag and drop its words;
-- parsed apart, the lines keep them.)
-- Adding the column rewrites `messages` and parses every stored message once, holding the
-- table's lock: on a large database run `memctl migrate` in a maintenance window.
ALTER TABLE messages ADD COLUMN text_search tsvector
    GENERATED ALWAYS AS (to_tsvector('english', '[' || role || ']: ' || content)) STORED;

-- tsvector_concat is strict: the first message's vector starts the state, and no messages
-- give NULL.
CREATE AGGREGATE tsvector_agg(tsvector) (SFUNC = tsvector_concat, STYPE = tsvector);

ALTER TABLE chunks ALTER COLUMN text_search DROP EXPRESSION;

-- Full-text vectors hardly compress (under 1% did here): store a long one out of line without
-- trying, as the vectors are (0006). The tries were 3% of the machine while an org grew.
ALTER TABLE messages ALTER COLUMN text_search SET STORAGE EXTERNAL;
ALTER TABLE chunks ALTER COLUMN text_search SET STORAGE EXTERNAL;

-- A writer that gives no full text (a replica still running the code from before this
-- migration, a bulk load) gets the window's text parsed, so no chunk is missing from lexical
-- search: on insert when it gives none, on update when it changes the text but not the full
-- text.
CREATE FUNCTION chunk_text_search() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.text_search IS NULL THEN
        NEW.text_search := to_tsvector('english', NEW.text);
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.text IS DISTINCT FROM OLD.text
           AND NEW.text_search IS NOT DISTINCT FROM OLD.text_search THEN
            NEW.text_search := to_tsvector('english', NEW.text);
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chunks_text_search BEFORE INSERT OR UPDATE OF text, text_search ON chunks
    FOR EACH ROW EXECUTE FUNCTION chunk_text_search();
