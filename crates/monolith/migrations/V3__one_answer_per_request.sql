-- At most one assistant answer per chat request: a completion job that runs
-- twice (retry after a crash, lease expiry) cannot store a second answer.
CREATE UNIQUE INDEX ai_conversation_messages_one_answer
    ON ai_conversation_messages (request_xid)
    WHERE role = 2 AND request_xid IS NOT NULL;
