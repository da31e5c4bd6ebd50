-- Duo where people work: the review bot, merge request reviewers,
-- discussions with diff positions and resolution, review records, and the
-- per-project triggers.

-- GitLab's user types; internal users (the review bot) never sign in and
-- hold no tokens.
ALTER TABLE users ADD COLUMN user_type text NOT NULL DEFAULT 'human'
    CHECK (user_type IN ('human', 'duo_code_review_bot'));

INSERT INTO users (username, name, email, user_type)
VALUES ('GitLabDuo', 'GitLab Duo', 'gitlab-duo@noreply.duo.invalid', 'duo_code_review_bot')
ON CONFLICT (username) DO UPDATE SET user_type = 'duo_code_review_bot';

CREATE TABLE merge_request_reviewers (
    merge_request_id bigint NOT NULL REFERENCES merge_requests (id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- GitLab's reviewer states.
    state text NOT NULL DEFAULT 'unreviewed'
        CHECK (state IN ('unreviewed', 'review_started', 'reviewed', 'requested_changes', 'approved', 'unapproved')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merge_request_id, user_id)
);
CREATE INDEX merge_request_reviewers_user ON merge_request_reviewers (user_id);

-- Discussions: every note belongs to one (GitLab's 40-hex discussion id; a
-- note that starts a thread gets a fresh one, a reply takes its thread's).
ALTER TABLE notes ADD COLUMN discussion_id text;
UPDATE notes SET discussion_id = md5('discussion-' || id::text) || substr(md5('more-' || id::text), 1, 8);
ALTER TABLE notes ALTER COLUMN discussion_id SET NOT NULL;
ALTER TABLE notes ALTER COLUMN discussion_id
    SET DEFAULT md5(random()::text || clock_timestamp()::text) || substr(md5(random()::text), 1, 8);
CREATE INDEX notes_discussion ON notes (discussion_id);
-- `DiffNote` (positioned on a diff line), `DiscussionNote` (a thread
-- started as one), NULL for a plain comment.
ALTER TABLE notes ADD COLUMN note_type text CHECK (note_type IN ('DiffNote', 'DiscussionNote'));
-- GitLab's position of a diff note (position_type, base_sha, start_sha,
-- head_sha, old_path, new_path, old_line, new_line).
ALTER TABLE notes ADD COLUMN position jsonb;
ALTER TABLE notes ADD COLUMN resolvable boolean NOT NULL DEFAULT false;
ALTER TABLE notes ADD COLUMN resolved_at timestamptz;
ALTER TABLE notes ADD COLUMN resolved_by_id bigint REFERENCES users (id) ON DELETE SET NULL;

-- Default review instructions (the YAML shape of
-- .gitlab/duo/mr-review-instructions.yaml), applied before the project's.
ALTER TABLE instance_settings ADD COLUMN duo_code_review_instructions text NOT NULL DEFAULT ''
    CHECK (length(duo_code_review_instructions) <= 65536);
ALTER TABLE groups ADD COLUMN duo_code_review_instructions text NOT NULL DEFAULT ''
    CHECK (length(duo_code_review_instructions) <= 65536);

-- One row per review the bot ran (or refused): what it read, skipped and
-- wrote, for follow-ups and for operators.
CREATE TABLE duo_code_reviews (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    merge_request_id bigint NOT NULL REFERENCES merge_requests (id) ON DELETE CASCADE,
    requester_id bigint REFERENCES users (id) ON DELETE SET NULL,
    -- reviewer_assigned | mention
    trigger text NOT NULL,
    status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done', 'refused', 'failed')),
    head_sha text,
    files_reviewed integer NOT NULL DEFAULT 0,
    files_skipped text[] NOT NULL DEFAULT '{}',
    comments integer NOT NULL DEFAULT 0,
    resolved integer NOT NULL DEFAULT 0,
    detail text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX duo_code_reviews_merge_request ON duo_code_reviews (merge_request_id, id);

-- Which events start which Duo flow in a project (absent row: the
-- event's default). Maintainers change them.
CREATE TABLE project_duo_triggers (
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    event text NOT NULL CHECK (event IN ('reviewer_assigned', 'mention', 'pipeline_failed')),
    enabled boolean NOT NULL,
    updated_by_id bigint REFERENCES users (id) ON DELETE SET NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, event)
);
