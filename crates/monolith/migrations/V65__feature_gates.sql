-- Feature flags as GitLab's Flipper stores them: a flag exists once an
-- administrator set any of its gates (until then the code's default
-- applies), and each gate value is one row.
--
--   boolean               'true' (no row: off)
--   actors                one row per actor: 'User:1', 'Group:2', 'Project:3'
--   groups                one row per feature group name: 'instance_admins'
--   percentage_of_actors  one row, '0'..'100'
--   percentage_of_time    one row, '0'..'100'
CREATE TABLE features (
    key text PRIMARY KEY CHECK (key ~ '^[a-z][a-z0-9_]*$' AND length(key) <= 100),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE feature_gates (
    feature_key text NOT NULL REFERENCES features (key) ON DELETE CASCADE,
    key text NOT NULL CHECK (key IN
        ('boolean', 'actors', 'groups', 'percentage_of_actors', 'percentage_of_time')),
    value text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (feature_key, key, value)
);

-- A percentage gate holds one value at most.
CREATE UNIQUE INDEX feature_gates_one_percentage
    ON feature_gates (feature_key, key)
    WHERE key IN ('boolean', 'percentage_of_actors', 'percentage_of_time');
