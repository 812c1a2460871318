-- +goose Up

-- An import stages its file in a table of its own before writing it a chunk
-- at a time (pkg/catalog, write.go). That table was a TEMP table, which
-- lives in one server session: behind a pooler in transaction mode
-- (PgBouncer pool_mode=transaction) an import's statements run in
-- whichever session is free, so a COPY or a chunk landed where the table
-- was not and the import stopped ("the import's staging table is not in
-- this session"), and the table stayed behind in the session that made it.
-- A staging table is now an UNLOGGED table in this schema, seen from every
-- session (and, unlogged, it writes no WAL for its rows). A table that is
-- no longer in a session's care is no longer dropped with the session, so
-- each import registers its table in runs, in the transaction that
-- creates it, and marks it seen while it runs; the next import drops the
-- tables of runs not seen for a while (a killed exportctl's).
CREATE SCHEMA import_staging;
CREATE TABLE import_staging.runs (
    staging    text PRIMARY KEY,
    owner_id   uuid NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now()
);

-- lz4 compresses the stored documents several times faster than pglz, on
-- write and on every read of a page. Imports chose it for their session
-- (SET default_toast_compression), which through a pooler in transaction
-- mode reaches whichever session runs the SET, not the chunks', and stays
-- on it for other clients: the columns choose it now. A server built
-- without lz4 keeps pglz. Rows already stored keep the compression they
-- were written with.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE export_items
            ALTER COLUMN category SET COMPRESSION lz4, ALTER COLUMN characteristics SET COMPRESSION lz4,
            ALTER COLUMN images SET COMPRESSION lz4, ALTER COLUMN texts SET COMPRESSION lz4,
            ALTER COLUMN doc_eng SET COMPRESSION lz4, ALTER COLUMN doc_rus SET COMPRESSION lz4,
            ALTER COLUMN doc_ukr SET COMPRESSION lz4;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE export_items
    ALTER COLUMN category SET COMPRESSION default, ALTER COLUMN characteristics SET COMPRESSION default,
    ALTER COLUMN images SET COMPRESSION default, ALTER COLUMN texts SET COMPRESSION default,
    ALTER COLUMN doc_eng SET COMPRESSION default, ALTER COLUMN doc_rus SET COMPRESSION default,
    ALTER COLUMN doc_ukr SET COMPRESSION default;
DROP SCHEMA import_staging CASCADE;
