-- Every question and every answer touches its thread's `last_updated_at`.
-- With the column in an index, each touch was a new row version with three
-- new index entries (twice per answer); without, the touch is a heap-only
-- update that leaves the indexes alone. A user's threads are few, so their
-- newest is found by sorting them; the retention job (one statement per
-- run) reads the table through.
CREATE INDEX ai_conversation_threads_owner ON ai_conversation_threads (user_id, conversation_type);
DROP INDEX ai_conversation_threads_user;
DROP INDEX ai_conversation_threads_idle;
-- Room on each page for the touched versions.
ALTER TABLE ai_conversation_threads SET (fillfactor = 90);
