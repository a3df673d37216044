-- Term statistics for org-wide lexical search of large orgs: how many chunks hold each lexeme,
-- refreshed in the background when an org's chunk count has drifted (see api_service/lexical.py).
-- BM25 weighs words by them, and a search matches on its rarest words first.
CREATE TABLE lexical_stats (
    org_id        text PRIMARY KEY REFERENCES orgs (org_id) ON DELETE CASCADE,
    chunks        bigint NOT NULL,
    avg_length    double precision NOT NULL,
    refreshed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE lexeme_df (
    org_id  text NOT NULL REFERENCES orgs (org_id) ON DELETE CASCADE,
    lexeme  text NOT NULL,
    df      integer NOT NULL,
    PRIMARY KEY (org_id, lexeme)
);
