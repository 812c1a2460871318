package sales

// The statements of a sale call. Parameters, the same in confirmSQL and
// cancelSQL: $1 owner id, $2 platform id, $3 idempotency key, $4 item id,
// $5 external order id.
//
// An idempotency record whose response is JSON null is pending: it is visible
// only inside the transaction that claimed it, since that transaction's write
// statement either stores the response or deletes the record before commit.

// claimSQL takes the idempotency key: $4 fingerprint, $5 retention in
// seconds. A live record of an earlier request is left alone (its row lock is
// taken and held to commit); an expired one not yet purged is taken over.
const claimSQL = `
INSERT INTO idempotency_records AS r
    (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
VALUES ($1, $2, $3, $4, 'null', now() + $5::float8 * interval '1 second')
ON CONFLICT (owner_id, platform_id, idempotency_key) DO UPDATE
SET fingerprint = excluded.fingerprint, response = excluded.response,
    created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE r.expires_at <= now()`

// recordAndItem is the tail shared by both write statements: it stores the
// response or drops the claim, and reports what the statement's snapshot saw
// (the key's record as it was before the statement, the item's state).
const recordAndItem = `
, saved AS (
    UPDATE idempotency_records r SET response = result.body
    FROM result
    WHERE r.owner_id = $1 AND r.platform_id = $2 AND r.idempotency_key = $3
), dropped AS (
    DELETE FROM idempotency_records r
    WHERE r.owner_id = $1 AND r.platform_id = $2 AND r.idempotency_key = $3
      AND r.response = 'null' AND NOT EXISTS (SELECT FROM result)
)
SELECT rec.fingerprint,
       coalesce(rec.response = 'null', false),
       rec.response::text,
       (SELECT body::text FROM result),
       it.id IS NOT NULL,
       coalesce(it.listed_active, false),
       coalesce(it.sold, false)
FROM (VALUES (1)) AS one (x)
LEFT JOIN idempotency_records rec
       ON rec.owner_id = $1 AND rec.platform_id = $2 AND rec.idempotency_key = $3
LEFT JOIN export_items it ON it.owner_id = $1 AND it.id = $4`

// confirmSQL sells the item if this transaction claimed the key and the item
// is listed and not sold. The UPDATE's WHERE is re-checked on the newest row
// version after waiting for a concurrent writer (READ COMMITTED), which is
// what makes the sale happen once. updated_at is stamped with
// clock_timestamp() in this last statement of the transaction, as late as
// possible before commit, so that updated_after syncs do not miss it.
const confirmSQL = `
WITH claim AS (
    SELECT FROM idempotency_records
    WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND response = 'null'
), item AS (
    UPDATE export_items SET sold = true, updated_at = clock_timestamp()
    WHERE owner_id = $1 AND id = $4 AND listed_active AND NOT sold
      AND EXISTS (SELECT FROM claim)
    RETURNING status, updated_at
), sale AS (
    INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
    SELECT $1, $4, $2, $5, item.updated_at FROM item
    RETURNING confirmed_at
), result AS (
    SELECT jsonb_build_object(
        'item_id', $4::text,
        'status', item.status,
        'stock_quantity', CASE item.status WHEN 'active' THEN 1 ELSE 0 END,
        'platform_id', $2::text,
        'external_order_id', $5::text,
        'confirmed_at', sale.confirmed_at) AS body
    FROM item, sale
)` + recordAndItem

// cancelSQL closes the open sale of this platform and external order, then
// makes the item sellable again. The sale row is locked first: the item's
// update depends on it, so a cancel racing another cancel of the same sale
// re-checks canceled_at IS NULL on the newest version and finds it closed.
const cancelSQL = `
WITH claim AS (
    SELECT FROM idempotency_records
    WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND response = 'null'
), sale AS (
    UPDATE sales SET canceled_at = clock_timestamp()
    WHERE owner_id = $1 AND item_id = $4 AND canceled_at IS NULL
      AND platform_id = $2 AND external_order_id = $5
      AND EXISTS (SELECT FROM claim)
    RETURNING confirmed_at, canceled_at
), item AS (
    UPDATE export_items SET sold = false, updated_at = clock_timestamp()
    WHERE owner_id = $1 AND id = $4 AND EXISTS (SELECT FROM sale)
    RETURNING status
), result AS (
    SELECT jsonb_build_object(
        'item_id', $4::text,
        'status', item.status,
        'stock_quantity', CASE item.status WHEN 'active' THEN 1 ELSE 0 END,
        'platform_id', $2::text,
        'external_order_id', $5::text,
        'confirmed_at', sale.confirmed_at,
        'canceled_at', sale.canceled_at) AS body
    FROM item, sale
)` + recordAndItem

// purgeSQL deletes at most $1 expired idempotency records, so that each
// purge transaction stays short.
const purgeSQL = `
DELETE FROM idempotency_records
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_records WHERE expires_at <= now() LIMIT $1))`
