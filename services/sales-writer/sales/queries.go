package sales

import "github.com/coinexport/export/pkg/catalog"

// The statements of a sale call. Parameters, the same in confirmSQL and
// cancelSQL: $1 owner id, $2 platform id, $3 idempotency key, $4 item id,
// $5 external order id, $6 request fingerprint, $7 retention in seconds.
//
// Each is one statement, run in one round trip and one transaction after
// the key's lock (keyLock, Writer.underKeyLock):
//
//   - live is the key's unexpired idempotency record, if one was committed
//     before the statement started. When there is one, nothing is changed:
//     the caller replays it or reports a conflict.
//   - bound is the key's refused first request, if any (migration 00006):
//     its fingerprint and the refusal answered (00007). A request with
//     another fingerprint changes nothing, and explain reports the
//     conflict; the identical request changes nothing either, and explain
//     answers the refusal again (a binding of an older build, without its
//     refusal, lets the identical request run again).
//   - Otherwise the item (and the sale) are changed under their row locks;
//     an UPDATE's WHERE is re-checked on the newest row version after
//     waiting for a concurrent writer (READ COMMITTED), so of two calls
//     racing for an item only one can change it.
//   - saved inserts the record with the response in the same transaction.
//     It is a plain INSERT: if another transaction stored the same key since
//     the statement started, the unique violation rolls the whole change
//     back, and the caller runs again to find that record.
//
// The outer SELECT reports the record the statement saw and the change it
// made, as typed columns so that the caller need not parse the response it
// just built. A call that changed nothing and saw no record is explained by
// explainSQL afterwards (see outcome.decide): the common path pays for no
// reads it does not need.

// keyState starts the three statements: what the key already holds.
const keyState = `
WITH live AS (
    SELECT fingerprint, response FROM idempotency_records
    WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND expires_at > now()
), bound AS (
    SELECT fingerprint, refusal FROM idempotency_refusals
    WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND expires_at > now()
)`

// writerLock takes the owner's shared sync lock (catalog.WriterLock) for
// the transaction. Each write statement requires it (EXISTS) in its first
// row-changing step, so it is taken before any row lock and before
// updated_at is stamped: a sync that starts meanwhile waits for this
// commit instead of missing the change (catalog's barrier.go says why).
// Taken first, it cannot close a cycle of waits with a sync's barrier,
// which holds nothing else. A commit group (group.go) takes the locks of
// several calls, of several owners, in one transaction, and can: holding
// one owner's lock, it waits behind another owner's barrier for a second
// group that waits behind the first owner's barrier for it. The group's
// lock_timeout ends that wait; its calls then run again alone.
var writerLock = `
, barrier AS (SELECT ` + catalog.WriterLock("$1::uuid") + `)`

// keyLock takes, until the transaction ends, an advisory lock of its own
// on the idempotency key ($1 owner, $2 platform, $3 key). Every statement
// that writes under a key (confirmSQL, cancelSQL, bindRefusedSQL) runs in
// a transaction that took it first, in a statement of its own, so that its
// snapshot is taken once the lock is held: two different requests sent
// with one key at once are then judged one after the other, each seeing
// what the other committed (spec 4.7 rule 3). Before, a request refused
// (its item sold, no sale to cancel) bound the key while another request
// under the key was executing, and both held the key (a probe: 22 of 30
// races). Keys whose hashes collide share a lock, which costs a wait,
// never a wrong answer. It is taken before the owner's sync lock
// (writerLock), in every transaction that takes both. It relies on READ
// COMMITTED (a snapshot per statement), which the writer's sessions are
// held to whatever the database's default (postgres.ReadCommitted): under
// REPEATABLE READ the lock's statement fixed the transaction's snapshot
// before the wait, and a sale under a key bound meanwhile to another
// request was executed (TestSalesRunAtReadCommittedWhateverTheDatabaseDefault).
const keyLock = `SELECT pg_advisory_xact_lock(` + keyLockClass + `, hashtext($1::text || '/' || $2::text || '/' || $3::text))`

// keyLockHearingWarnings is keyLock for a call that commits alone (a
// group of one, or a call run alone): it also sets client_min_messages to
// warning for the transaction (set_config's is_local), so that a WARNING
// its COMMIT draws (a wait for a synchronous standby cut: commitWarnings)
// reaches the writer whatever DATABASE_URL, the role or the database sets;
// at error PostgreSQL sends none. Folded into the statement the call sends
// anyway: no round trip and no statement more (a group of several sets it
// in groupSettingsSQL). It sets no lock_timeout, as groupSettingsSQL does:
// that timeout keeps a group's calls from waiting for one call's lock, and
// a call alone holds up no other (README, "Commit groups";
// TestACallAloneWaitsForALockAsAGroupsCallDoes).
const keyLockHearingWarnings = `SELECT pg_advisory_xact_lock(` + keyLockClass + `, hashtext($1::text || '/' || $2::text || '/' || $3::text)), ` +
	`set_config('client_min_messages', 'warning', true)`

// keyLockClass is the first key of keyLock: a namespace apart from the
// owner's sync lock (catalog.WriterLock) and any other advisory lock.
const keyLockClass = "1801812339" // "keys" in ASCII

// savedAndReport ends both statements: it stores the response and reports
// the record seen and the change made.
const savedAndReport = `
, saved AS (
    INSERT INTO idempotency_records
        (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
    SELECT $1, $2, $3, $6, result.body, now() + $7::float8 * interval '1 second'
    FROM result
)
SELECT live.fingerprint, live.response::text,
       result.status, result.confirmed_at, result.canceled_at
FROM (VALUES (1)) AS one (x)
LEFT JOIN live ON true
LEFT JOIN result ON true`

// confirmSQL sells the item if it is listed and not sold, to a platform that
// exists (a plain read: a foreign key would lock the platform's row, which
// every concurrent confirm of the platform shares; see migration 00004).
// updated_at is stamped with clock_timestamp() in the transaction's only
// statement, late before commit, under the owner's sync lock, so that
// updated_after syncs do not miss the change; confirmed_at is the same
// instant. Not after a wait for the row: PostgreSQL computes the new row
// before it waits for a transaction that only locked it (SELECT … FOR
// UPDATE), and recomputes it only if the row was updated meanwhile, so such
// a stamp is the time the wait began (README, "How a call works"). It never
// moves backwards: if the clock stepped back below the row's last stamp,
// the row gets that stamp plus a microsecond (see catalog.NextUpdatedAt).
var confirmSQL = keyState + writerLock + `
, item AS (
    UPDATE export_items SET sold = true, updated_at = ` + catalog.NextUpdatedAt("export_items") + `
    WHERE owner_id = $1 AND id = $4 AND listed_active AND NOT sold
      AND EXISTS (SELECT FROM barrier)
      AND NOT EXISTS (SELECT FROM live)
      AND NOT EXISTS (SELECT FROM bound WHERE fingerprint <> $6 OR refusal IS NOT NULL)
      AND EXISTS (SELECT FROM platforms WHERE id = $2)
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
        'confirmed_at', sale.confirmed_at) AS body,
        item.status, sale.confirmed_at, NULL::timestamptz AS canceled_at
    FROM item, sale
)` + savedAndReport

// cancelSQL closes the open sale of this platform and external order, then
// makes the item sellable again. The sale row is locked first and the item's
// update depends on it, so a cancel racing another cancel of the same sale
// re-checks canceled_at IS NULL on the newest version and finds it closed.
// canceled_at is never before confirmed_at, even if the clock stepped back
// since the confirm (migration 00005: this statement is what keeps that rule).
var cancelSQL = keyState + writerLock + `
, sale AS (
    UPDATE sales SET canceled_at = greatest(clock_timestamp(), confirmed_at)
    WHERE owner_id = $1 AND item_id = $4 AND canceled_at IS NULL
      AND platform_id = $2 AND external_order_id = $5
      AND EXISTS (SELECT FROM barrier)
      AND NOT EXISTS (SELECT FROM live)
      AND NOT EXISTS (SELECT FROM bound WHERE fingerprint <> $6 OR refusal IS NOT NULL)
    RETURNING confirmed_at, canceled_at
), item AS (
    UPDATE export_items SET sold = false, updated_at = ` + catalog.NextUpdatedAt("export_items") + `
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
        'canceled_at', sale.canceled_at) AS body,
        item.status, sale.confirmed_at, sale.canceled_at
    FROM item, sale
)` + savedAndReport

// explainSQL reads, in a snapshot taken after a write statement that changed
// nothing, what explains that: the key's record (committed meanwhile by an
// identical request, perhaps) or refused request, the item's state, and
// whether this platform and order have an open sale of it, and whether the
// platform exists. Parameters $1 to $5 as above.
const explainSQL = keyState + `
SELECT live.fingerprint,
       live.response::text,
       (SELECT fingerprint FROM bound),
       (SELECT refusal FROM bound),
       it.id IS NOT NULL,
       coalesce(it.listed_active AND NOT it.sold, false),
       coalesce(it.sold, false),
       EXISTS (SELECT FROM platforms p WHERE p.id = $2),
       EXISTS (SELECT FROM sales s
               WHERE s.owner_id = $1 AND s.item_id = $4 AND s.canceled_at IS NULL
                 AND s.platform_id = $2 AND s.external_order_id = $5)
FROM (VALUES (1)) AS one (x)
LEFT JOIN live ON true
LEFT JOIN export_items it ON it.owner_id = $1 AND it.id = $4`

// dropExpiredSQL removes the key's record if it has expired, so that the key
// can be used again before the purge gets to it.
const dropExpiredSQL = `
DELETE FROM idempotency_records
WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND expires_at <= now()`

// bindRefusedSQL binds the key ($1 owner, $2 platform, $3 key) to the
// refused request ($4 its fingerprint; $5 the retention in seconds) and its
// refusal ($6, the error code answered) unless an unexpired binding holds it
// already, and reports what the key holds then: the binding's fingerprint
// and refusal, or a live record's fingerprint and response. A live record
// wins over the refusal and nothing is bound: a request with the key
// executed and committed after this one's statement took its snapshot.
// Another request's record makes the refusal a conflict (spec 4.7 rule 3);
// an identical request's (a copy of this call, the item sellable again in
// between) makes the answer its replay, so that no copy of a call is told
// "refused" while another copy sold.
const bindRefusedSQL = `
WITH executed AS (
    SELECT fingerprint, response FROM idempotency_records
    WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND expires_at > now()
), bound AS (
    INSERT INTO idempotency_refusals AS r (owner_id, platform_id, idempotency_key, fingerprint, refusal, expires_at)
    SELECT $1, $2, $3, $4, $6, now() + $5::float8 * interval '1 second'
    WHERE NOT EXISTS (SELECT FROM executed)
    ON CONFLICT (owner_id, platform_id, idempotency_key) DO UPDATE
    SET fingerprint = CASE WHEN r.expires_at > now() THEN r.fingerprint ELSE excluded.fingerprint END,
        refusal = CASE WHEN r.expires_at > now() THEN r.refusal ELSE excluded.refusal END,
        expires_at = CASE WHEN r.expires_at > now() THEN r.expires_at ELSE excluded.expires_at END
    RETURNING fingerprint, refusal
)
SELECT (SELECT fingerprint FROM bound), (SELECT refusal FROM bound),
       (SELECT fingerprint FROM executed), (SELECT response::text FROM executed)`

// purgeSQL deletes at most $1 expired idempotency records, and purgeRefusalsSQL
// at most $1 expired refusals, so that each purge transaction stays short.
const (
	purgeSQL = `
DELETE FROM idempotency_records
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_records WHERE expires_at <= now() LIMIT $1))`
	purgeRefusalsSQL = `
DELETE FROM idempotency_refusals
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_refusals WHERE expires_at <= now() LIMIT $1))`
)
