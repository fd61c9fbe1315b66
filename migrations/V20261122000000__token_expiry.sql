-- Tokens may expire: NULL means never. The server refuses an expired token
-- even while its principal is cached.
ALTER TABLE tokens ADD COLUMN expires_at timestamptz;
