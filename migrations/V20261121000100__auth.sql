-- Users, their API tokens and their policies, after lakeFS's auth model.

CREATE TABLE users (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL UNIQUE
               CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Tokens are stored only as SHA-256 digests: a database dump does not
-- reveal a usable token. Tokens are 256-bit random values, so a fast hash
-- is enough (no password-style stretching needed).
CREATE TABLE tokens (
    digest      bytea       PRIMARY KEY CHECK (octet_length(digest) = 32),
    user_id     bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    description text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tokens_user_id ON tokens (user_id);

-- What a user may do, per repository; '*' stands for every repository.
CREATE TABLE policies (
    user_id    bigint  NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    repository text    NOT NULL CHECK (repository = '*' OR repository ~ '^[a-z0-9][a-z0-9-]{2,62}$'),
    can_read   boolean NOT NULL DEFAULT true,
    can_write  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (user_id, repository)
);
