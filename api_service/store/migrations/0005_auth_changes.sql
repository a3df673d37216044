-- api_service keeps the keys it resolved (auth.KeyCache) and forgets them all when told on
-- channel memory_auth_changed. These triggers tell it of every change that can alter what a
-- key resolves to: the key itself (revoked, scopes, expiry, deleted), its org's plan or
-- redaction, and the plan's limits. A new key needs no notice: unknown keys are not kept.
-- Writes' charges update other columns of orgs, and fire nothing.

CREATE FUNCTION notify_auth_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('memory_auth_changed', '');
    RETURN NULL;
END $$;

CREATE TRIGGER api_keys_auth_changed AFTER UPDATE OR DELETE OR TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION notify_auth_changed();
CREATE TRIGGER orgs_auth_changed AFTER UPDATE OF plan, redact_pii OR DELETE OR TRUNCATE ON orgs
    FOR EACH STATEMENT EXECUTE FUNCTION notify_auth_changed();
CREATE TRIGGER plans_auth_changed AFTER UPDATE OR DELETE OR TRUNCATE ON plans
    FOR EACH STATEMENT EXECUTE FUNCTION notify_auth_changed();
