-- The lakeFS-compatible API (/lakefs): each repository's one branch, named
-- at creation ('main' unless given), and its read-only flag; and object
-- paths compared byte by byte, so that a listing walks the primary key's
-- index in the order lakeFS lists, on any database whatever its locale.
ALTER TABLE repositories
    ADD COLUMN default_branch text NOT NULL DEFAULT 'main'
        CHECK (default_branch ~ '^[A-Za-z0-9_][A-Za-z0-9_-]{0,255}$'),
    ADD COLUMN read_only boolean NOT NULL DEFAULT false;

ALTER TABLE objects ALTER COLUMN path TYPE text COLLATE "C";

-- A read-only repository's objects cannot change, whichever way a write
-- comes (either API, an import, by hand). Checked once per statement; a
-- class 23 error, so the object writer refuses only the rows at fault and
-- commits the rest of its batch. Deleting the repository itself (its
-- objects go by cascade) is allowed: its row is gone by then.
CREATE FUNCTION pgbatch_refuse_read_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    repo text;
BEGIN
    -- Nearly always: no repository is read-only, and the changed rows
    -- need not be looked at.
    IF NOT EXISTS (SELECT 1 FROM repositories WHERE read_only) THEN
        RETURN NULL;
    END IF;
    SELECT c.repository INTO repo
    FROM changed c JOIN repositories r ON r.name = c.repository
    WHERE r.read_only
    LIMIT 1;
    IF repo IS NOT NULL THEN
        RAISE EXCEPTION 'repository % is read-only', repo
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER objects_read_only_insert AFTER INSERT ON objects
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_refuse_read_only();
CREATE TRIGGER objects_read_only_update AFTER UPDATE ON objects
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_refuse_read_only();
CREATE TRIGGER objects_read_only_delete AFTER DELETE ON objects
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION pgbatch_refuse_read_only();
