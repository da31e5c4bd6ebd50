-- Self-hosted model definitions and the model chosen per AI feature.
CREATE TABLE ai_self_hosted_models (
    id bigserial PRIMARY KEY,
    name text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 255),
    -- The model family (GitLab's accepted self-hosted models: mistral, gpt, ...).
    model text NOT NULL,
    endpoint text NOT NULL CHECK (length(endpoint) <= 255),
    identifier text CHECK (length(identifier) <= 255),
    -- The API key, sealed with AES-256-GCM (identity::secret_box); never shown again.
    api_token_sealed bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ai_feature_settings (
    id bigserial PRIMARY KEY,
    feature text NOT NULL UNIQUE,
    provider text NOT NULL CHECK (provider IN ('disabled', 'vendored', 'self_hosted')),
    ai_self_hosted_model_id bigint REFERENCES ai_self_hosted_models(id) ON DELETE RESTRICT,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((provider = 'self_hosted') = (ai_self_hosted_model_id IS NOT NULL))
);
