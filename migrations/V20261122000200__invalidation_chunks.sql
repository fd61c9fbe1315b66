-- Invalidation notifications, revised:
-- - keys go out in as many notifications as they need (each under NOTIFY's
--   8,000-byte limit), so a micro-batch of a few hundred rows drops just
--   those keys elsewhere; only a statement of more than 10,000 rows (an
--   import) asks for everything to be dropped;
-- - an UPDATE sends the keys before and after (a path changed by hand);
-- - a statement that touched no row sends nothing;
-- - TRUNCATE of tokens drops every cached principal.

-- Sends `items` (JSON texts) on `pgbatch_invalidate` as
-- {"c": kind, "k": [item, ...]} in chunks under the payload limit, or
-- {"c": all_kind, "all": true} when there are too many. Set-based (one
-- window over the items), so a batch of a few hundred keys costs about
-- what one json_agg would.
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

CREATE FUNCTION pgbatch_notify_objects_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbatch_notify_keys('objects', 'objects',
        ARRAY(SELECT json_build_array(repository, path)::text FROM new_rows));
    RETURN NULL;
END
$$;

CREATE FUNCTION pgbatch_notify_objects_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbatch_notify_keys('objects', 'objects',
        ARRAY(SELECT json_build_array(repository, path)::text
              FROM (SELECT repository, path FROM new_rows
                    UNION SELECT repository, path FROM old_rows) AS k));
    RETURN NULL;
END
$$;

CREATE FUNCTION pgbatch_notify_objects_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbatch_notify_keys('objects', 'objects',
        ARRAY(SELECT json_build_array(repository, path)::text FROM old_rows));
    RETURN NULL;
END
$$;

DROP TRIGGER objects_notify_insert ON objects;
DROP TRIGGER objects_notify_update ON objects;
DROP TRIGGER objects_notify_delete ON objects;
DROP FUNCTION pgbatch_notify_objects();

CREATE TRIGGER objects_notify_insert AFTER INSERT ON objects
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects_inserted();
CREATE TRIGGER objects_notify_update AFTER UPDATE ON objects
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects_updated();
CREATE TRIGGER objects_notify_delete AFTER DELETE ON objects
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects_deleted();

CREATE FUNCTION pgbatch_notify_tokens_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbatch_notify_keys('tokens', 'auth',
        ARRAY(SELECT to_json(encode(digest, 'hex'))::text FROM new_rows));
    RETURN NULL;
END
$$;

CREATE FUNCTION pgbatch_notify_tokens_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbatch_notify_keys('tokens', 'auth',
        ARRAY(SELECT to_json(encode(digest, 'hex'))::text
              FROM (SELECT digest FROM new_rows UNION SELECT digest FROM old_rows) AS d));
    RETURN NULL;
END
$$;

CREATE FUNCTION pgbatch_notify_tokens_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbatch_notify_keys('tokens', 'auth',
        ARRAY(SELECT to_json(encode(digest, 'hex'))::text FROM old_rows));
    RETURN NULL;
END
$$;

DROP TRIGGER tokens_notify_insert ON tokens;
DROP TRIGGER tokens_notify_update ON tokens;
DROP TRIGGER tokens_notify_delete ON tokens;
DROP FUNCTION pgbatch_notify_tokens();

CREATE TRIGGER tokens_notify_insert AFTER INSERT ON tokens
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens_inserted();
CREATE TRIGGER tokens_notify_update AFTER UPDATE ON tokens
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens_updated();
CREATE TRIGGER tokens_notify_delete AFTER DELETE ON tokens
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens_deleted();
CREATE TRIGGER tokens_notify_truncate AFTER TRUNCATE ON tokens
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_auth();
