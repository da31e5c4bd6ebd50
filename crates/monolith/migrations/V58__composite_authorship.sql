-- Composite identity (Duo Workflow tokens owned by a service account acting
-- for a human): what a run writes is authored by the service account, and
-- the human it acted for is kept beside it (GitLab shows "on behalf of").
ALTER TABLE notes ADD COLUMN on_behalf_of_user_id bigint REFERENCES users (id) ON DELETE SET NULL;
ALTER TABLE issues ADD COLUMN on_behalf_of_user_id bigint REFERENCES users (id) ON DELETE SET NULL;
ALTER TABLE merge_requests ADD COLUMN on_behalf_of_user_id bigint REFERENCES users (id) ON DELETE SET NULL;
ALTER TABLE epics ADD COLUMN on_behalf_of_user_id bigint REFERENCES users (id) ON DELETE SET NULL;
