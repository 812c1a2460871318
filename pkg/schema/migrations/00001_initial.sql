-- +goose Up

-- An owner account: every API key and every export item belongs to exactly one.
CREATE TABLE owners (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A sales platform (marketplace, store) that reports external sales.
CREATE TABLE platforms (
    id         text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    name       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as the SHA-256 of the secret; the secret is shown once.
CREATE TABLE api_keys (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner_id    uuid NOT NULL REFERENCES owners (id),
    platform_id text REFERENCES platforms (id),
    name        text NOT NULL DEFAULT '',
    prefix      text NOT NULL,
    hash        bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    scopes      text[] NOT NULL CHECK (cardinality(scopes) > 0
                    AND scopes <@ ARRAY['export:read', 'sales:write']::text[]),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    -- spec 5: a sales:write key is bound to one owner and one platform.
    CONSTRAINT sales_write_needs_platform
        CHECK (NOT ('sales:write' = ANY (scopes)) OR platform_id IS NOT NULL)
);
CREATE INDEX api_keys_owner_idx ON api_keys (owner_id);

-- Every gateway instance LISTENs on this channel and drops the revoked key from
-- its cache at once; the payload is the key id, never the secret or its hash.
-- +goose StatementBegin
CREATE FUNCTION notify_api_key_revoked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('api_key_revoked', NEW.id::text);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER api_keys_revoked
    AFTER UPDATE OF revoked_at ON api_keys
    FOR EACH ROW
    WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS DISTINCT FROM NEW.revoked_at)
    EXECUTE FUNCTION notify_api_key_revoked();

-- Export items: ready listings. listed_active is the owner's own switch; sold is
-- set by a confirmed external sale. The exported status is derived from both, so
-- an import can never reactivate an item that is sold.
--
-- doc_eng, doc_rus and doc_ukr hold the item's static JSON per language, rendered
-- when the item is written: the members of the ExportItem object without its
-- braces and without status, stock_quantity and updated_at, which the reader
-- prepends from the columns. The read path therefore encodes no JSON per item.
CREATE TABLE export_items (
    owner_id        uuid NOT NULL REFERENCES owners (id),
    id              text NOT NULL CHECK (length(id) BETWEEN 1 AND 128),
    coin_id         text,
    listed_active   boolean NOT NULL,
    sold            boolean NOT NULL DEFAULT false,
    status          text GENERATED ALWAYS AS (
                        CASE WHEN listed_active AND NOT sold THEN 'active' ELSE 'inactive' END
                    ) STORED,
    price           numeric(18, 4) CHECK (price >= 0),
    currency        char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    category        jsonb,
    characteristics jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(characteristics) = 'object'),
    images          jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(images) = 'array'),
    texts           jsonb NOT NULL CHECK (texts ? 'ENG'),
    doc_eng         text NOT NULL,
    doc_rus         text NOT NULL,
    doc_ukr         text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (owner_id, id)
);
-- The export list is one range scan of one of these two indexes:
-- WHERE owner_id = $1 [AND status = $2] AND (updated_at, id) > ($3, $4) ORDER BY updated_at, id LIMIT n
CREATE INDEX export_items_sync_idx ON export_items (owner_id, updated_at, id);
CREATE INDEX export_items_status_sync_idx ON export_items (owner_id, status, updated_at, id);

-- External sales. "Sold at most once" is the partial unique index below: at most
-- one open (not canceled) sale per item, enforced by PostgreSQL itself.
CREATE TABLE sales (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner_id          uuid NOT NULL,
    item_id           text NOT NULL,
    platform_id       text NOT NULL REFERENCES platforms (id),
    external_order_id text NOT NULL CHECK (length(external_order_id) BETWEEN 1 AND 128),
    confirmed_at      timestamptz NOT NULL,
    canceled_at       timestamptz,
    FOREIGN KEY (owner_id, item_id) REFERENCES export_items (owner_id, id),
    CHECK (canceled_at IS NULL OR canceled_at >= confirmed_at)
);
CREATE UNIQUE INDEX sales_one_open_sale_per_item ON sales (owner_id, item_id) WHERE canceled_at IS NULL;

-- Idempotency records (spec 4.7), scoped by owner and platform rather than by
-- key, so a retry sent with a rotated key of the same platform still replays.
-- Written in the same transaction as the sale they describe.
CREATE TABLE idempotency_records (
    owner_id        uuid NOT NULL REFERENCES owners (id),
    platform_id     text NOT NULL REFERENCES platforms (id),
    idempotency_key text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    fingerprint     bytea NOT NULL,
    response        jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (owner_id, platform_id, idempotency_key)
);
CREATE INDEX idempotency_records_expiry_idx ON idempotency_records (expires_at);

-- +goose Down
DROP TABLE idempotency_records;
DROP TABLE sales;
DROP TABLE export_items;
DROP TRIGGER api_keys_revoked ON api_keys;
DROP FUNCTION notify_api_key_revoked();
DROP TABLE api_keys;
DROP TABLE platforms;
DROP TABLE owners;
