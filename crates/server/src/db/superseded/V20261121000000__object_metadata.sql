-- Object metadata, after lakeFS: repositories, and objects keyed by
-- (repository, path) with their physical location and user metadata.

CREATE TABLE repositories (
    name              text        PRIMARY KEY
                      CHECK (name ~ '^[a-z0-9][a-z0-9-]{2,62}$'),
    storage_namespace text        NOT NULL CHECK (storage_namespace <> ''),
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE objects (
    repository       text        NOT NULL REFERENCES repositories (name) ON DELETE CASCADE,
    path             text        NOT NULL
                     CHECK (path <> '' AND octet_length(path) <= 1024),
    physical_address text        NOT NULL,
    size_bytes       bigint      NOT NULL CHECK (size_bytes >= 0),
    checksum         text        NOT NULL,
    content_type     text        NOT NULL DEFAULT 'application/octet-stream',
    user_metadata    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    mtime            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (repository, path)
);

-- The seed benchmark's table (lakeFS micro-batching post): pk is the row
-- number left-padded with zeros to 20 characters, payload the number and
-- ' - ' right-padded with '*' to 33 characters.
CREATE TABLE random_read_test (
    pk      text PRIMARY KEY,
    payload text NOT NULL
);
