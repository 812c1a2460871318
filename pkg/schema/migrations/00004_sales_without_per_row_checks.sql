-- +goose Up

-- A confirm and a cancel each change an item's sold flag and updated_at, and
-- insert or close a sale. This migration takes work off those statements that
-- guarded nothing a sale can change.
--
-- 1. The catalog columns' rules move from table CHECK constraints to domains.
--    PostgreSQL evaluates every CHECK constraint of a table on every UPDATE,
--    whatever columns change, and reads each expression back from the catalog
--    for every statement: a sale, which sets only sold and updated_at, paid
--    for six checks of values it never touches (in a perf profile of the
--    sales scenario, 9% of PostgreSQL's CPU went to ExecConstraints). A
--    domain's check runs where a value is assigned to the column (insert,
--    import, or an update that sets it), so every stored value still obeys
--    the same rules and sales no longer pay for them.
--
--    The domains are created without their checks, so changing the columns'
--    types is a catalog change (same storage, indexes kept) rather than a
--    rewrite of the table; ALTER DOMAIN ADD CONSTRAINT then checks the stored
--    values once.
--
--    Deploying: the migration holds an exclusive lock on export_items while
--    it checks and analyzes the table (seconds per million items), and a
--    statement a service prepared before it that returns id fails once per
--    connection ("cached plan must not change result type"). Run it with the
--    services stopped, or restart them after it.
--
-- 2. The two foreign keys of sales go, like those of idempotency_records in
--    00002. Each ran a lookup with FOR KEY SHARE in every confirm: on the
--    item row the same statement has just locked and updated (so it exists),
--    and on the platform's row, which every concurrent confirm of one
--    platform locks too; concurrent lockers of one row turn the lock into a
--    MultiXact, and every lock writes WAL. A sale is inserted only by the
--    confirm statement, from the item row it updated; its platform comes from
--    the caller's API key, which references platforms; and no code path
--    deletes items or platforms. "Sold at most once" is unchanged: it is the
--    partial unique index sales_one_open_sale_per_item.
ALTER TABLE sales
    DROP CONSTRAINT IF EXISTS sales_platform_id_fkey,
    DROP CONSTRAINT IF EXISTS sales_owner_id_item_id_fkey;

CREATE DOMAIN item_id AS text;
CREATE DOMAIN item_price AS numeric(18, 4);
CREATE DOMAIN currency_code AS char(3);
CREATE DOMAIN item_characteristics AS jsonb;
CREATE DOMAIN item_images AS jsonb;
CREATE DOMAIN item_texts AS jsonb;

ALTER TABLE export_items
    DROP CONSTRAINT export_items_id_check,
    DROP CONSTRAINT export_items_price_check,
    DROP CONSTRAINT export_items_currency_check,
    DROP CONSTRAINT export_items_characteristics_check,
    DROP CONSTRAINT export_items_images_check,
    DROP CONSTRAINT export_items_texts_check,
    ALTER COLUMN id TYPE item_id,
    ALTER COLUMN price TYPE item_price,
    ALTER COLUMN currency TYPE currency_code,
    ALTER COLUMN characteristics TYPE item_characteristics,
    ALTER COLUMN images TYPE item_images,
    ALTER COLUMN texts TYPE item_texts;

ALTER DOMAIN item_id ADD CONSTRAINT item_id_length CHECK (length(VALUE) BETWEEN 1 AND 128);
ALTER DOMAIN item_price ADD CONSTRAINT item_price_not_negative CHECK (VALUE >= 0);
ALTER DOMAIN currency_code ADD CONSTRAINT currency_code_format CHECK (VALUE ~ '^[A-Z]{3}$');
ALTER DOMAIN item_characteristics ADD CONSTRAINT item_characteristics_is_object CHECK (jsonb_typeof(VALUE) = 'object');
ALTER DOMAIN item_images ADD CONSTRAINT item_images_is_array CHECK (jsonb_typeof(VALUE) = 'array');
ALTER DOMAIN item_texts ADD CONSTRAINT item_texts_have_english CHECK (VALUE ? 'ENG');

-- A column whose type changes loses its planner statistics; without them the
-- planner expects thousands of rows from a lookup by (owner_id, id). Only a
-- table with rows is analyzed: an empty one would be recorded as empty, and
-- plans made on it scan it whole as it fills (see 00005).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM export_items) THEN
        ANALYZE export_items;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE export_items
    ALTER COLUMN id TYPE text,
    ALTER COLUMN price TYPE numeric(18, 4),
    ALTER COLUMN currency TYPE char(3),
    ALTER COLUMN characteristics TYPE jsonb,
    ALTER COLUMN images TYPE jsonb,
    ALTER COLUMN texts TYPE jsonb,
    ADD CONSTRAINT export_items_id_check CHECK (length(id) BETWEEN 1 AND 128),
    ADD CONSTRAINT export_items_price_check CHECK (price >= 0),
    ADD CONSTRAINT export_items_currency_check CHECK (currency ~ '^[A-Z]{3}$'),
    ADD CONSTRAINT export_items_characteristics_check CHECK (jsonb_typeof(characteristics) = 'object'),
    ADD CONSTRAINT export_items_images_check CHECK (jsonb_typeof(images) = 'array'),
    ADD CONSTRAINT export_items_texts_check CHECK (texts ? 'ENG');

DROP DOMAIN item_id, item_price, currency_code, item_characteristics, item_images, item_texts;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM export_items) THEN
        ANALYZE export_items;
    END IF;
END
$$;
-- +goose StatementEnd

ALTER TABLE sales
    ADD CONSTRAINT sales_platform_id_fkey FOREIGN KEY (platform_id) REFERENCES platforms (id),
    ADD CONSTRAINT sales_owner_id_item_id_fkey FOREIGN KEY (owner_id, item_id) REFERENCES export_items (owner_id, id);
