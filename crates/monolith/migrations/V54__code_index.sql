-- The code index behind codebase search: one state row per project and the
-- chunks of its default branch with their embeddings (pgvector) and a
-- full-text vector. Chunks carry the blob id of their file, so a file whose
-- content did not change (across pushes, branches or renames) is never
-- embedded twice.
CREATE EXTENSION IF NOT EXISTS vector;

-- GitLab's Duo context exclusion: globs of files never sent to AI features.
ALTER TABLE projects ADD COLUMN duo_context_exclusion_rules text[] NOT NULL DEFAULT '{}';

CREATE TABLE code_index_states (
    project_id bigint PRIMARY KEY REFERENCES projects(id) ON DELETE CASCADE,
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'indexing', 'ready', 'failed')),
    -- The default branch's commit the chunks describe (NULL: nothing indexed yet,
    -- or a re-index was asked for: the next run walks the whole tree).
    indexed_commit text,
    embedding_model text,
    embedding_dimensions integer,
    chunk_count integer NOT NULL DEFAULT 0,
    file_count integer NOT NULL DEFAULT 0,
    last_error text,
    last_error_code text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    indexed_at timestamptz
);

CREATE TABLE code_chunks (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    path text NOT NULL,
    blob_id text NOT NULL,
    language text NOT NULL,
    start_line integer NOT NULL,
    end_line integer NOT NULL,
    start_byte integer NOT NULL,
    end_byte integer NOT NULL,
    symbol text,
    content text NOT NULL,
    embedding_model text NOT NULL,
    -- Untyped so a model of any size fits; the HNSW index below covers the
    -- bundled MiniLM's 384 dimensions.
    embedding vector NOT NULL,
    dimensions integer NOT NULL,
    search_text tsvector NOT NULL,
    UNIQUE (project_id, path, start_byte)
);
CREATE INDEX code_chunks_path ON code_chunks (project_id, path text_pattern_ops);
CREATE INDEX code_chunks_blob ON code_chunks (project_id, blob_id, embedding_model);
CREATE INDEX code_chunks_search_text ON code_chunks USING gin (search_text);
-- Cosine distance (`<=>`), the operator the search uses. Small projects are
-- searched exactly through code_chunks_path; the planner takes this index
-- once a project's chunks outnumber what an exact scan reads quickly.
CREATE INDEX code_chunks_embedding_384 ON code_chunks
    USING hnsw ((embedding::vector(384)) vector_cosine_ops) WITH (m = 16, ef_construction = 64)
    WHERE dimensions = 384;
