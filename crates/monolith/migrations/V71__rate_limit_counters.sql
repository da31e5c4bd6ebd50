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

-- What the log counted carries over: each user's requests of the last eight
-- hours (the chat budget's default window) open a window at the earliest.
INSERT INTO rate_limit_counters (user_id, action, window_ends_at, used)
SELECT user_id, action, min(occurred_at) + interval '8 hours', count(*)
FROM rate_limit_events
WHERE occurred_at > now() - interval '8 hours'
GROUP BY user_id, action;

-- `rate_limit_events` and `duo_rate_limit_take` stay for processes of the
-- previous release during a rolling upgrade; nothing of this release uses them.
