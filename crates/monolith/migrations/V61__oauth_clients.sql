-- OAuth 2.1 for MCP clients: applications registered dynamically (RFC 7591,
-- public clients with PKCE), the authorization codes users grant them, and
-- the refresh tokens beside their access tokens (in oauth_access_tokens).
CREATE TABLE oauth_applications (
    id bigserial PRIMARY KEY,
    uid text NOT NULL UNIQUE,
    name text NOT NULL,
    redirect_uris text[] NOT NULL,
    scopes text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE oauth_access_grants (
    id bigserial PRIMARY KEY,
    application_id bigint NOT NULL REFERENCES oauth_applications (id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    code_digest bytea NOT NULL UNIQUE,
    redirect_uri text NOT NULL,
    code_challenge text NOT NULL,
    scopes text[] NOT NULL,
    resource text,
    expires_at timestamptz NOT NULL,
    used_at timestamptz
);

CREATE TABLE oauth_refresh_tokens (
    id bigserial PRIMARY KEY,
    application_id bigint NOT NULL REFERENCES oauth_applications (id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    grant_id bigint REFERENCES oauth_access_grants (id) ON DELETE CASCADE,
    token_digest bytea NOT NULL UNIQUE,
    scopes text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

ALTER TABLE oauth_access_tokens
    ADD COLUMN application_id bigint REFERENCES oauth_applications (id) ON DELETE CASCADE,
    ADD COLUMN grant_id bigint REFERENCES oauth_access_grants (id) ON DELETE CASCADE;
CREATE INDEX oauth_access_tokens_application ON oauth_access_tokens (application_id, user_id)
    WHERE application_id IS NOT NULL;
