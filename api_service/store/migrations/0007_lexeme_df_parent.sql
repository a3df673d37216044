-- An org's lexeme counts hang off its lexical_stats row instead of its orgs row. A refresh
-- inserts one lexeme_df row per distinct word in the org (tens of thousands), and each row's
-- foreign-key check share-locked the orgs row, which every write to the org updates (its
-- usage): the checks then had to resolve multixacts, 8% of the machine while an org grew.
-- Deleting an org still removes them: orgs -> lexical_stats -> lexeme_df, both cascading.
ALTER TABLE lexeme_df DROP CONSTRAINT lexeme_df_org_id_fkey;
DELETE FROM lexeme_df d WHERE NOT EXISTS (SELECT 1 FROM lexical_stats s WHERE s.org_id = d.org_id);
-- Checked at commit, so a replica still running the code from before this migration, which
-- writes the counts before the stats row, recounts as before.
ALTER TABLE lexeme_df ADD CONSTRAINT lexeme_df_org_id_fkey
    FOREIGN KEY (org_id) REFERENCES lexical_stats (org_id) ON DELETE CASCADE
    DEFERRABLE INITIALLY DEFERRED;
