-- Git repositories: each project's default branch and whether only maintainers
-- may push to it, the record of every accepted ref change (push, or a commit
-- through the API), and the token scopes for git over HTTP.
ALTER TABLE projects ADD COLUMN default_branch text NOT NULL DEFAULT 'main';
ALTER TABLE projects ADD COLUMN protect_default_branch boolean NOT NULL DEFAULT false;

CREATE TABLE repository_pushes (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    ref text NOT NULL,
    before_sha text NOT NULL,
    after_sha text NOT NULL,
    pusher_id bigint REFERENCES users(id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX repository_pushes_project ON repository_pushes (project_id, id);
