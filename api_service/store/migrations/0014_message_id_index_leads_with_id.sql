-- The unique index on message ids leads with the id: (message_id, org_id), no longer
-- (org_id, message_id). Keyed by the org first it could serve any query of an org's messages,
-- and on a table never analyzed (a new database, for the first minute or so, until autovacuum
-- analyzes it) the planner took it for an append's read of the lines before its messages:
-- an index scan over every message of the org, filtered on the conversation and sequence,
-- where the primary key finds those few lines. Appends run on generic plans (a4cd3b5), which
-- a connection keeps until the table is analyzed, so an org growing on a new database read
-- all its earlier messages at every append: 2.3-3.8 million index entries while one grew to
-- 10k chunks. Led by the id, the index serves only lookups by id (a message's edit), and the
-- pair stays unique within an org as before.
--
-- Dropping the old index locks the messages table until the new one is built.
DROP INDEX messages_id;
CREATE UNIQUE INDEX messages_id ON messages (message_id, org_id);
