-- Cross-instance cache invalidation on Postgres's own LISTEN/NOTIFY.
--
-- Every committed change that a server's cache may hold sends, from the
-- same transaction, one notification per statement on the channel
-- `pgbatch_invalidate`: delivered at commit, and only if it commits, to
-- every server listening. Triggers catch every path (micro-batched
-- upserts, deletes, imports, cascades, and changes made by hand).
--
-- Payloads (JSON): {"c":"objects","k":[[repository, path], ...]},
-- {"c":"objects","all":true}, {"c":"tokens","k":["<digest hex>", ...]},
-- {"c":"auth","all":true}. A statement touching more than 100 rows, or
-- whose keys would pass NOTIFY's 8,000-byte limit, sends "all" instead.

CREATE FUNCTION pgbatch_notify_objects() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
    n bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        SELECT count(*) INTO n FROM old_rows;
    ELSE
        SELECT count(*) INTO n FROM new_rows;
    END IF;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    IF n <= 100 THEN
        IF TG_OP = 'DELETE' THEN
            SELECT json_build_object('c', 'objects', 'k', json_agg(json_build_array(repository, path)))::text
              INTO payload FROM old_rows;
        ELSE
            SELECT json_build_object('c', 'objects', 'k', json_agg(json_build_array(repository, path)))::text
              INTO payload FROM new_rows;
        END IF;
    END IF;
    IF payload IS NULL OR octet_length(payload) > 7900 THEN
        payload := '{"c":"objects","all":true}';
    END IF;
    PERFORM pg_notify('pgbatch_invalidate', payload);
    RETURN NULL;
END
$$;

CREATE TRIGGER objects_notify_insert AFTER INSERT ON objects
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_objects();
CREATE TRIGGER objects_notify_update AFTER UPDATE ON objects
    REFERENCING NEW TABLE AS new_rows
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

-- Tokens by digest; users and policies change whole principals.
CREATE FUNCTION pgbatch_notify_tokens() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT json_build_object('c', 'tokens', 'k', json_agg(encode(digest, 'hex')))::text
          INTO payload FROM new_rows;
    ELSE
        SELECT json_build_object('c', 'tokens', 'k', json_agg(encode(digest, 'hex')))::text
          INTO payload FROM old_rows;
    END IF;
    IF payload IS NULL OR octet_length(payload) > 7900 THEN
        payload := '{"c":"auth","all":true}';
    END IF;
    PERFORM pg_notify('pgbatch_invalidate', payload);
    RETURN NULL;
END
$$;

CREATE TRIGGER tokens_notify_insert AFTER INSERT ON tokens
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens();
CREATE TRIGGER tokens_notify_update AFTER UPDATE ON tokens
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens();
CREATE TRIGGER tokens_notify_delete AFTER DELETE ON tokens
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_notify_tokens();

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
