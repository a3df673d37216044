-- Room on each page of chunks for a row's next version. The indexer stores a chunk's vector
-- (an UPDATE) moments after the append inserted the row; on full pages that version went to
-- another page and so into every index, the full-text GIN with all of the chunk's words (two
-- thirds of the updates while an org grew). On its own page it is a HOT update, which adds no
-- index entry. Pages written from now on keep 30% free; the row itself is small (its text,
-- full text and vector are stored out of line).
ALTER TABLE chunks SET (fillfactor = 70);
