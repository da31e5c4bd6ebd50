-- What developers said when they dismissed one of the review bot's diff
-- comments ("false positive", "this is intended"): later reviews of the
-- project show the model the recent ones for the same file or language and
-- do not post a comment the developers already dismissed on that file.
-- The review keeps the newest few hundred per project (older ones go).
CREATE TABLE duo_review_feedback (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    merge_request_id bigint REFERENCES merge_requests (id) ON DELETE SET NULL,
    -- The file the bot's comment was on (its position's new path).
    path text NOT NULL CHECK (length(path) BETWEEN 1 AND 4096),
    -- The bot's comment and the reply that dismissed it (both capped).
    comment text NOT NULL CHECK (length(comment) <= 4000),
    reply text NOT NULL CHECK (length(reply) <= 2000),
    user_id bigint REFERENCES users (id) ON DELETE SET NULL,
    -- The reply note: one feedback item per reply, however often its job runs.
    reply_note_id bigint NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX duo_review_feedback_project ON duo_review_feedback (project_id, id DESC);
