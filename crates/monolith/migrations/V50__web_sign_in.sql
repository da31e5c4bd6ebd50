-- Signing in to the web pages: a password per user (argon2id, PHC string;
-- NULL means the user cannot sign in with a password), browser sessions
-- (only digests of the cookie values are stored), failed sign-in attempts
-- (rate limit per username and per address), and chat feedback.
ALTER TABLE users ADD COLUMN encrypted_password text;

CREATE TABLE web_sessions (
    id bigserial PRIMARY KEY,
    session_digest bytea NOT NULL UNIQUE,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    -- Sent with every form and GraphQL request of the session (X-CSRF-Token).
    csrf_token text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX web_sessions_user ON web_sessions (user_id);
CREATE INDEX web_sessions_expiry ON web_sessions (expires_at);

CREATE TABLE sign_in_failures (
    id bigserial PRIMARY KEY,
    -- 'user:<lower-case username>' or 'ip:<address>'
    key text NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sign_in_failures_lookup ON sign_in_failures (key, occurred_at);

CREATE TABLE ai_message_feedback (
    id bigserial PRIMARY KEY,
    message_id bigint NOT NULL REFERENCES ai_conversation_messages(id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    helpful boolean NOT NULL,
    reason text NOT NULL DEFAULT '' CHECK (length(reason) <= 2000),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (message_id, user_id)
);
