-- Checkpoint bodies are stored as the JSON text that was posted (checked by
-- the monolith): parsing a long run's state into jsonb on every insert cost
-- more than the rest of the request, and nothing queries inside a body.
-- PostgreSQL still compresses the text out of line.
ALTER TABLE duo_workflows_checkpoints ALTER COLUMN checkpoint TYPE text USING checkpoint::text;
