-- A rate-limit check in one statement and one round trip: the per-user lock,
-- the count over the window, the new event and the clean-up of old ones,
-- which `rate_limit::take` sent as six statements (a transaction of four).
-- The transaction-scoped lock serializes one user's checks for one action,
-- so two replicas never both take the last request of a budget.
CREATE FUNCTION duo_rate_limit_take(
    p_user_id bigint,
    p_action text,
    p_limit integer,
    p_window_secs double precision
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    used bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_action || ':' || p_user_id::text, 0));
    SELECT count(*) INTO used FROM rate_limit_events
     WHERE user_id = p_user_id AND action = p_action
       AND occurred_at > now() - make_interval(secs => p_window_secs);
    IF used >= p_limit THEN
        RETURN false;
    END IF;
    INSERT INTO rate_limit_events (user_id, action) VALUES (p_user_id, p_action);
    DELETE FROM rate_limit_events
     WHERE user_id = p_user_id AND action = p_action
       AND occurred_at <= now() - make_interval(secs => p_window_secs);
    RETURN true;
END
$$;
