-- A generation number for the settings a chat answer reads besides access:
-- the feature flags and the AI model settings. Any change to them (by the
-- admin API, the Rails-compatible endpoints or plain SQL) moves it on in the
-- same transaction, so a process may keep what it read and read it again only
-- when the number it sees with the user's access facts has moved.
ALTER TABLE instance_settings ADD COLUMN settings_generation bigint NOT NULL DEFAULT 0;

CREATE FUNCTION bump_settings_generation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE instance_settings SET settings_generation = settings_generation + 1;
    RETURN NULL;
END;
$$;

CREATE TRIGGER features_settings_generation
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON features
    FOR EACH STATEMENT EXECUTE FUNCTION bump_settings_generation();
CREATE TRIGGER feature_gates_settings_generation
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON feature_gates
    FOR EACH STATEMENT EXECUTE FUNCTION bump_settings_generation();
CREATE TRIGGER ai_feature_settings_settings_generation
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ai_feature_settings
    FOR EACH STATEMENT EXECUTE FUNCTION bump_settings_generation();
CREATE TRIGGER ai_self_hosted_models_settings_generation
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ai_self_hosted_models
    FOR EACH STATEMENT EXECUTE FUNCTION bump_settings_generation();
