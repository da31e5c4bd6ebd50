-- Experiment and beta AI features for the whole instance (GitLab's
-- `instance_level_ai_beta_features_enabled`), set on the admin pages.
ALTER TABLE instance_settings
    ADD COLUMN instance_level_ai_beta_features_enabled boolean NOT NULL DEFAULT false;
