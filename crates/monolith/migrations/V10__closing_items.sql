-- Who closed an issue, merge request or epic, and when (GitLab's closed_at and
-- closed_by); issues also get a due date.
ALTER TABLE issues ADD COLUMN closed_at timestamptz;
ALTER TABLE issues ADD COLUMN closed_by_id bigint REFERENCES users(id) ON DELETE SET NULL;
ALTER TABLE issues ADD COLUMN due_date date;
ALTER TABLE merge_requests ADD COLUMN closed_at timestamptz;
ALTER TABLE merge_requests ADD COLUMN closed_by_id bigint REFERENCES users(id) ON DELETE SET NULL;
ALTER TABLE epics ADD COLUMN closed_at timestamptz;
ALTER TABLE epics ADD COLUMN closed_by_id bigint REFERENCES users(id) ON DELETE SET NULL;
-- Items closed before this migration: closed at their last update, by nobody known.
UPDATE issues SET closed_at = updated_at WHERE state = 'closed';
UPDATE merge_requests SET closed_at = updated_at WHERE state = 'closed';
UPDATE epics SET closed_at = updated_at WHERE state = 'closed';
