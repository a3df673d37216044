-- A vector row (about 3.1 KB at 768 dimensions) passes the 2 KB at which PostgreSQL tries to
-- compress a row's MAIN values, so every stored vector went through pglz. A model's vectors
-- never compress, and the try took 39% of writing one (17.2 -> 10.5 us a row,
-- benchmarks/store/compression.py). The hashing embedder's sparse vectors did compress (3 KB
-- to 0.5 KB, 53.8 us a row): the e2e benchmark paid 2.3% of the machine for a cost no model's
-- vectors have. With the target at its largest a row that fits its page is stored as it is;
-- a larger vector (a model of more than about 2,000 dimensions) is still compressed, then
-- moved out of line. Rows stored before keep their form until stored again (VACUUM FULL
-- copies them as they are). The hashing embedder's vectors now take the 3 KB a model's do.
ALTER TABLE chunk_vectors SET (toast_tuple_target = 8160);
