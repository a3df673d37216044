-- The append that created an org's default memory counted the memory's title twice in the
-- conversation's size and once in the org's, so deleting the memory took the org's total
-- below what it still holds (below zero, for an org with nothing else). The title is the
-- only part counted twice. Then every org's total is its conversations' sum again, as every
-- write keeps it, which undoes what such deletes took off.
UPDATE conversations
   SET storage_bytes = storage_bytes - octet_length(title)
 WHERE is_default AND title IS NOT NULL AND storage_bytes >= octet_length(title);

-- A write charges its org last in its transaction. Holding writers off the org rows until
-- this commits makes the sums below see every write that has charged its org, and a write
-- still under way add its bytes after them; without the lock, a write that committed while
-- the recount waited on its org row was left out of it (the recount's snapshot predates it).
-- The conversations' update comes first: a write waiting on a default memory locked above has
-- not charged its org yet, so it cannot hold this lock up.
LOCK TABLE orgs IN SHARE ROW EXCLUSIVE MODE;

UPDATE orgs o
   SET storage_bytes = coalesce((SELECT sum(c.storage_bytes) FROM conversations c
                                  WHERE c.org_id = o.org_id), 0);
