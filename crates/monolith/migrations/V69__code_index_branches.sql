-- Codebase search on branches other than the default (seed 002, phase 2).
-- A branch is indexed on demand (the first question about it) and at most
-- DUO_CODE_INDEX_MAX_BRANCHES of them are kept per project, the least
-- recently searched going first. A branch's chunks live in code_chunks with
-- its branch_id (NULL: the default branch); a file whose blob is already
-- embedded anywhere in the project is copied from there, never embedded again.
CREATE TABLE code_index_branches (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    branch text NOT NULL,
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'indexing', 'ready', 'failed')),
    indexed_commit text,
    embedding_model text,
    chunk_count integer NOT NULL DEFAULT 0,
    file_count integer NOT NULL DEFAULT 0,
    last_error text,
    last_error_code text,
    -- Eviction order: the branch searched longest ago goes first.
    last_used_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    indexed_at timestamptz,
    UNIQUE (project_id, branch)
);

-- Evicting or deleting a branch drops its chunks with it.
ALTER TABLE code_chunks
    ADD COLUMN branch_id bigint REFERENCES code_index_branches(id) ON DELETE CASCADE;

-- The default branch's indexes cover its rows only, so its queries (which
-- say `branch_id IS NULL`) read no branch rows; a branch has its own.
ALTER TABLE code_chunks DROP CONSTRAINT code_chunks_project_id_path_start_byte_key;
CREATE UNIQUE INDEX code_chunks_default_place ON code_chunks (project_id, path, start_byte)
    WHERE branch_id IS NULL;
CREATE UNIQUE INDEX code_chunks_branch_place ON code_chunks (branch_id, path, start_byte)
    WHERE branch_id IS NOT NULL;
DROP INDEX code_chunks_path;
CREATE INDEX code_chunks_path ON code_chunks (project_id, path text_pattern_ops)
    WHERE branch_id IS NULL;
CREATE INDEX code_chunks_branch_path ON code_chunks (branch_id, path text_pattern_ops)
    WHERE branch_id IS NOT NULL;
