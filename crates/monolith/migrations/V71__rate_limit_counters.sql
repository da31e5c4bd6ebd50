-- A request budget as one counter per user and action, as GitLab's
-- ApplicationRateLimiter keeps one per key in Redis: the window opens with
-- the first request counted and lasts the configured length; the next
-- request after it opens a new one. One row updated in place, where the
-- event log (`rate_limit_events`) grew a row per request and was counted
-- over the window on every check.
CREATE TABLE rate_limit_counters (
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    action text NOT NULL,
    window_ends_at timestamptz NOT NULL,
    used integer NOT NULL,
    PRIMARY KEY (user_id, action)
);

-- Budgets start afresh: each action's window is configured (60 s for Duo
-- Workflow's direct access, 8 hours for chat by default) and unknown here,
-- so the log's rows cannot become counters without risking a window far
-- longer than the action's own. The cost is at most one window's requests
-- more per user around the upgrade.

-- `rate_limit_events` and `duo_rate_limit_take` stay for processes of the
-- previous release during a rolling upgrade; nothing of this release uses them.
