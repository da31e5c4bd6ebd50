-- AI usage: one event per use of an AI feature (GitLab's `ai_usage_events`),
-- and for each Duo Chat question the facts of how it was answered.
--
-- `day` is the event's UTC calendar day, stored so per-day aggregation and
-- date-range filters use plain b-tree indexes.

CREATE TABLE ai_usage_events (
    id bigserial PRIMARY KEY,
    -- GitLab's event name, e.g. 'request_duo_chat_response'.
    event text NOT NULL CHECK (event ~ '^[a-z_]{1,64}$'),
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    -- Where the question was asked about: the project of the page's resource,
    -- or the group of an epic or group page; both null for questions about
    -- no resource.
    project_id bigint REFERENCES projects(id) ON DELETE SET NULL,
    namespace_id bigint REFERENCES groups(id) ON DELETE SET NULL,
    "timestamp" timestamptz NOT NULL DEFAULT now(),
    day date GENERATED ALWAYS AS (("timestamp" AT TIME ZONE 'UTC')::date) STORED
);

CREATE INDEX ai_usage_events_day ON ai_usage_events (day, event);
CREATE INDEX ai_usage_events_project_day ON ai_usage_events (project_id, day)
    WHERE project_id IS NOT NULL;
CREATE INDEX ai_usage_events_namespace_day ON ai_usage_events (namespace_id, day)
    WHERE namespace_id IS NOT NULL;
CREATE INDEX ai_usage_events_user_day ON ai_usage_events (user_id, day);

CREATE TABLE ai_chat_question_usage (
    event_id bigint PRIMARY KEY REFERENCES ai_usage_events(id) ON DELETE CASCADE,
    -- The chat request (`requestId`); no foreign key: threads and their
    -- messages are deleted by retention, the usage figures stay.
    request_id uuid NOT NULL UNIQUE,
    thread_id bigint NOT NULL,
    -- '/explain' and the like; null for questions to the agent.
    slash_command text CHECK (slash_command ~ '^/[a-z_]{1,32}$'),
    -- Tools the agent ran, in order, each once.
    tools text[] NOT NULL DEFAULT '{}',
    -- The Duo error code of a failed answer (A1000, M3003, ...); null when answered.
    error_code text CHECK (error_code ~ '^[AGM][0-9]{4}$'),
    input_tokens integer CHECK (input_tokens >= 0),
    output_tokens integer CHECK (output_tokens >= 0),
    -- True when the token counts are estimated from the text, not reported by a model.
    tokens_estimated boolean NOT NULL,
    -- From the start of the answer to its first streamed text; null when
    -- nothing was streamed.
    first_token_ms integer CHECK (first_token_ms >= 0),
    total_ms integer NOT NULL CHECK (total_ms >= 0),
    -- Filled by the categorisation job (the `categorize_question` prompt).
    category text CHECK (char_length(category) <= 64),
    detailed_category text CHECK (char_length(detailed_category) <= 200),
    language text CHECK (char_length(language) <= 16),
    labels text[],
    categorized_at timestamptz,
    -- Why no category was stored (Duo off, gateway failure, ...); never the question.
    category_skipped text CHECK (char_length(category_skipped) <= 200)
);

CREATE INDEX ai_chat_question_usage_category ON ai_chat_question_usage (category)
    WHERE category IS NOT NULL;
