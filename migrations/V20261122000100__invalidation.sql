-- Cross-instance cache invalidation on Postgres's own LISTEN/NOTIFY.
--
-- Every committed change that a server's cache may hold sends, from the
-- same transaction, notifications on the channel `pgbatch_invalidate`:
-- delivered at commit, and only if it commits, to every server listening.
-- Triggers catch every path (micro-batched upserts, deletes, imports,
-- cascades, and changes made by hand).
--
-- Payloads (JSON): {"c":"objects","k":[[repository, path], ...]},
-- {"c":"objects","all":true}, {"c":"tokens","k":["<digest hex>", ...]},
-- {"c":"auth","all":true}. The keys go out in as many notifications as
-- they need, each under NOTIFY's 8,000-byte limit; an UPDATE names the keys
-- before and after; a statement of more than 10,000 rows sends "all"
-- instead, and one that touched no row sends nothing.

-- Sends `items` (JSON texts) as {"c": kind, "k": [item, ...]} in chunks
-- under the payload limit, or {"c": all_kind, "all": true} when there are
-- too many. Set-based (one window over the items), so a batch of a few
-- hundred keys costs about what one json_agg would.
CREATE FUNCTION pgbatch_notify_keys(kind text, all_kind text, items text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    head constant text := '{"c":"' || kind || '","k":[';
    payload text;
BEGIN
    IF items IS NULL OR cardinality(items) = 0 THEN
        RETURN;
    END IF;
    -- Chunks hold items up to 5,000 bytes of running length, so each is
    -- under 5,000 + the largest item (2,500 at most) + the head: under
    -- NOTIFY's 8,000. Server paths are at most 1,024 bytes; a larger item
    -- (written by hand) drops everything instead.
    IF cardinality(items) > 10000
       OR EXISTS (SELECT 1 FROM unnest(items) AS i WHERE octet_length(i) > 2500) THEN
        PERFORM pg_notify('pgbatch_invalidate', '{"c":"' || all_kind || '","all":true}');
        RETURN;
    END IF;
    FOR payload IN
        SELECT head || string_agg(item, ',' ORDER BY ord) || ']}'
        FROM (SELECT item, ord,
                     (sum(octet_length(item) + 1) OVER (ORDER BY ord)) / 5000 AS chunk
              FROM unnest(items) WITH ORDINALITY AS t(item, ord)) AS s
        GROUP BY chunk
    LOOP
        PERFORM pg_notify('pgbatch_invalidate', payload);
    END LOOP;
END
$$;

-- Each branch names only the transition tables its event declares
-- (PL/pgSQL plans a statement when it first runs it).
CREATE FUNCTION pgbatch_notify_objects() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pgbatch_notify_keys('objects', 'objects',
            ARRAY(SELECT json_build_array(repository, path)::text FROM new_rows));
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM pgbatch_notify_keys('objects', 'objects',
            ARRAY(SELECT json_build_array(repository, path)::text
                  FROM (SELECT repository, path FROM new_rows
                        UNION SELECT repository, path FROM old_rows) AS k));
    ELSE
        PERFORM pgbatch_notify_keys('objects', 'objects',
            ARRAY(SELECT json_build_array(repository, path)::text FROM old_rows));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER objects_notify_insert AFTER INSERT ON objects
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects();
CREATE TRIGGER objects_notify_update AFTER UPDATE ON objects
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects();
CREATE TRIGGER objects_notify_delete AFTER DELETE ON objects
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects();

-- A repository created or deleted changes "no such repository" answers.
CREATE FUNCTION pgbatch_notify_all_objects() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgbatch_invalidate', '{"c":"objects","all":true}');
    RETURN NULL;
END
$$;

CREATE TRIGGER repositories_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON repositories
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_all_objects();
CREATE TRIGGER objects_notify_truncate AFTER TRUNCATE ON objects
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_all_objects();

-- Tokens by digest.
CREATE FUNCTION pgbatch_notify_tokens() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pgbatch_notify_keys('tokens', 'auth',
            ARRAY(SELECT to_json(encode(digest, 'hex'))::text FROM new_rows));
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM pgbatch_notify_keys('tokens', 'auth',
            ARRAY(SELECT to_json(encode(digest, 'hex'))::text
                  FROM (SELECT digest FROM new_rows UNION SELECT digest FROM old_rows) AS d));
    ELSE
        PERFORM pgbatch_notify_keys('tokens', 'auth',
            ARRAY(SELECT to_json(encode(digest, 'hex'))::text FROM old_rows));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tokens_notify_insert AFTER INSERT ON tokens
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens();
CREATE TRIGGER tokens_notify_update AFTER UPDATE ON tokens
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens();
CREATE TRIGGER tokens_notify_delete AFTER DELETE ON tokens
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens();

-- Users and policies change whole principals; so does emptying tokens.
CREATE FUNCTION pgbatch_notify_auth() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgbatch_invalidate', '{"c":"auth","all":true}');
    RETURN NULL;
END
$$;

CREATE TRIGGER users_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON users
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_auth();
CREATE TRIGGER policies_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON policies
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_auth();
CREATE TRIGGER tokens_notify_truncate AFTER TRUNCATE ON tokens
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_auth();
