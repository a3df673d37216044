-- The append that created an org's default memory counted the memory's title twice in the
-- conversation's size and once in the org's, so deleting the memory took the org's total
-- below what it still holds (below zero, for an org with nothing else). The title is the
-- only part counted twice. Then every org's total is its conversations' sum again, as every
-- write keeps it, which undoes what such deletes took off.
UPDATE conversations
   SET storage_bytes = storage_bytes - octet_length(title)
 WHERE is_default AND title IS NOT NULL AND storage_bytes >= octet_length(title);

UPDATE orgs o
   SET storage_bytes = coalesce((SELECT sum(c.storage_bytes) FROM conversations c
                                  WHERE c.org_id = o.org_id), 0);
