// Package export reads export items for the list and item routes. Items are
// stored pre-rendered per language (see pkg/catalog), so a page is one index
// range scan whose rows are composed into JSON by appending bytes: no item is
// decoded or encoded on the way out.
package export

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Errors of this package; the HTTP layer maps each to one status and code.
var (
	ErrNotFound      = errors.New("export: item not found")
	ErrInvalidCursor = errors.New("export: invalid cursor")
	// ErrCursorSignature is ErrInvalidCursor for a well-formed cursor
	// whose signature does not match (cursor.ErrSignature).
	ErrCursorSignature = fmt.Errorf("%w: signature", ErrInvalidCursor)
)

// Query is one list request, already validated.
type Query struct {
	OwnerID      string
	Lang         string     // ENG, RUS or UKR
	Limit        int        // 1 to 100
	Status       string     // "", active or inactive
	UpdatedAfter *time.Time // strictly after; microsecond precision
	Cursor       string     // "" for the first page
	// HeadOnly is a HEAD: its answer carries no items and no next cursor,
	// so a first page takes no sync barrier, no page is read ahead for it,
	// nor taken from what was read ahead for the GET of the same cursor.
	HeadOnly bool
}

// position is where a page ends: the last (updated_at, id) it holds.
type position = cursor.Position

// MaxPageBytes bounds the items of one list page: once a page's items pass
// it, the page ends there, with fewer than limit items and a next cursor.
// An item's document may be up to about 2 MiB (an import line is up to
// 1 MiB), so 100 of them could make a page the gateway refuses to relay
// (it reads an export-reader answer whole up to 64 MiB): a 502 on every
// retry of that page, a sync that never ends. A page of 100 ordinary items
// is about 100 KB. 4 MiB, not more: reading and sending a page costs the
// reader several times its size in memory (at 16 MiB, four syncs of 2 MB
// items peaked it at 359 MB, past the Deployment's 256 Mi; 169 MB at 4).
const MaxPageBytes = 4 << 20

// Reader reads export items from PostgreSQL (a replica is fine).
type Reader struct {
	// pool gives each read its connection through postgres.Acquire, never
	// by a query on the pool: with PostgreSQL out of connection slots, a
	// read that found every connection busy waits for one of them there,
	// where the pool's own query failed at once asking for one more.
	pool    *pgxpool.Pool
	cursors *cursor.Codec
	ahead   *readAhead
	// maxPageBytes is MaxPageBytes; tests lower it.
	maxPageBytes int
	// fresh says whether the database is fresh enough to serve a list
	// page (RefuseListsUnless); nil: always.
	fresh func() error
}

// Option changes a Reader.
type Option func(*Reader)

// RefuseListsUnless makes every list page call fresh first and fail with
// its error, before any read: a standby lagging beyond what a client's
// overlap covers must not let a sync succeed (replica.Monitor.Check). The
// item route does not ask: one item read from a lagging standby is stale
// but not lost, as nothing checkpoints on it.
func RefuseListsUnless(fresh func() error) Option {
	return func(r *Reader) { r.fresh = fresh }
}

// NewReader returns a Reader over pool that signs cursors with cursors and
// reads list pages ahead as ahead says.
func NewReader(pool *pgxpool.Pool, cursors *cursor.Codec, ahead ReadAhead, opts ...Option) *Reader {
	r := &Reader{pool: pool, cursors: cursors, ahead: newReadAhead(ahead), maxPageBytes: MaxPageBytes}
	for _, opt := range opts {
		opt(r)
	}
	return r
}

// StopReadingAhead ends the reads of pages ahead still running and makes
// any started later fail at once: call it once the server has drained, as
// no request will ask for those pages. Left to their own bound
// (EXPORT_READER_QUERY_TIMEOUT), a read waiting on export_items' lock (a
// migration's) held the pool's Close, and so the stop, past the drain and
// the grace period that counts only the drain and the last flush of spans.
func (r *Reader) StopReadingAhead() { r.ahead.stop() }

// Collectors are the Reader's metrics, for the service's registry.
func (r *Reader) Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{r.ahead.results}, r.ahead.gauges...)
}

// AppendPage appends the page's ExportItems, comma-separated, to dst and
// returns the cursor of the next page, or "" when this page is the last.
// One extra row is read to know whether another page exists.
func (r *Reader) AppendPage(ctx context.Context, dst []byte, q Query) ([]byte, string, error) {
	owner, err := catalog.ParseOwnerID(q.OwnerID)
	if err != nil {
		return dst, "", fmt.Errorf("export: %w", err)
	}
	binding := cursor.Binding{OwnerID: q.OwnerID, Status: q.Status, UpdatedAfter: q.UpdatedAfter}
	after, err := r.decodeCursor(q.Cursor, binding)
	if err != nil {
		return dst, "", err
	}
	// After the cursor's check: a cursor that can never work is a 400
	// whatever the replica's state, not a 503 the client would retry.
	if r.fresh != nil {
		if err := r.fresh(); err != nil {
			return dst, "", err
		}
	}
	if err := r.syncBarrier(ctx, owner, q, after); err != nil {
		return dst, "", err
	}
	issued := true
	readAhead := r.ahead.enabled() && !q.HeadOnly
	if after != nil && readAhead {
		var served bool
		var next string
		dst, next, served, issued, err = r.fromReadAhead(ctx, dst, q)
		if served || err != nil {
			return dst, next, err
		}
	}
	dst, next, err := r.scan(ctx, dst, q, owner, after)
	if err != nil || next == nil {
		return dst, "", err
	}
	next.Sync = syncOf(after)
	nextCursor := r.cursors.Encode(*next, binding)
	if readAhead {
		r.readAheadFrom(ctx, q, owner, binding, *next, nextCursor, issued)
	}
	return dst, nextCursor, nil
}

// decodeCursor returns the position a list page starts after: nil for a
// first page (no cursor).
func (r *Reader) decodeCursor(c string, binding cursor.Binding) (*position, error) {
	if c == "" {
		return nil, nil
	}
	pos, err := r.cursors.Decode(c, binding)
	if errors.Is(err, cursor.ErrSignature) {
		return nil, ErrCursorSignature
	}
	if err != nil {
		return nil, ErrInvalidCursor
	}
	return &pos, nil
}

// syncBarrier holds a first page (after nil), which starts a sync, until
// the changes stamped before now are committed (catalog's barrier.go), so
// that the sync sees them. A HEAD starts none (it gets no items), so it does
// not hold up the owner's writers.
func (r *Reader) syncBarrier(ctx context.Context, owner pgtype.UUID, q Query, after *position) error {
	if after != nil || q.HeadOnly {
		return nil
	}
	conn, err := postgres.Acquire(ctx, r.pool)
	if err != nil {
		return fmt.Errorf("export: list: %w", err)
	}
	defer conn.Release()
	if err := catalog.SyncBarrier(ctx, conn, owner); err != nil {
		return fmt.Errorf("export: list: %w", err)
	}
	return nil
}

// syncOf is the sync a page after the position belongs to: the cursor's,
// or a new one for a first page, and for a cursor of version 1 (from
// before cursors carried their sync).
func syncOf(after *position) uint64 {
	if after != nil && after.Sync != 0 {
		return after.Sync
	}
	return newSync()
}

// fromReadAhead answers the request from the page read ahead for its cursor
// when there is one, ready and fresh (served). issued is false when the
// cursor came from another reader instance (or from before a restart): that
// sync is being served elsewhere, so reading ahead for it would most likely
// be wasted.
func (r *Reader) fromReadAhead(ctx context.Context, dst []byte, q Query) (out []byte, next string, served, issued bool, err error) {
	ahead, issued := r.ahead.take(aheadKey{q.Cursor, q.Lang, q.Limit})
	if !issued {
		r.ahead.results.WithLabelValues("miss").Inc()
		return dst, "", false, false, nil
	}
	ready, err := r.ahead.use(ctx, ahead)
	if err != nil {
		return dst, "", false, true, fmt.Errorf("export: list: %w", err)
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.Bool("export.read_ahead", ready))
	if !ready {
		return dst, "", false, true, nil
	}
	dst = append(dst, ahead.body...)
	ahead.release()
	return dst, ahead.nextCursor, true, true, nil
}

// readAheadFrom starts reading the page after pos, whose cursor the request
// just issued, or only marks the cursor when the request's own cursor came
// from elsewhere. The cursors of the pages read carry pos's sync, so they
// answer only requests of that sync.
func (r *Reader) readAheadFrom(ctx context.Context, q Query, owner pgtype.UUID, binding cursor.Binding, pos position, posCursor string, issued bool) {
	if !issued {
		r.ahead.mark(aheadKey{posCursor, q.Lang, q.Limit})
		return
	}
	r.ahead.begin(ctx, &chain{
		fetch: func(ctx context.Context, after position, n int) ([]scannedPage, error) {
			return r.scanPages(ctx, postgres.AcquireUnlessNoSlot, q, owner, &after, n, newPageBuffer)
		},
		cursor: func(p position) string {
			p.Sync = pos.Sync
			return r.cursors.Encode(p, binding)
		},
		fresh: r.fresh,
		lang:  q.Lang,
		limit: q.Limit,
	}, pos, posCursor)
}

// acquireFunc gives a read its connection of pool.
type acquireFunc func(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error)

// scannedPage is one page of a scan: its items, comma-separated, and where
// it ends (nil when no row follows it).
type scannedPage struct {
	body []byte
	next *position
}

// scan appends the page after the position (from the start when nil) to dst.
func (r *Reader) scan(ctx context.Context, dst []byte, q Query, owner pgtype.UUID, after *position) ([]byte, *position, error) {
	pages, err := r.scanPages(ctx, postgres.Acquire, q, owner, after, 1, func() []byte { return dst })
	if err != nil {
		return dst, nil, err
	}
	return pages[0].body, pages[0].next, nil
}

// scanPages reads up to n consecutive pages after the position in one
// query (one extra row tells whether another page follows the last). Each
// page's items are appended to a buffer from newBody. A page ends after
// limit items, or earlier once its items pass maxPageBytes (so it never has
// more rows than limit, and n·limit+1 rows still tell whether one follows).
// It always returns at least one page, possibly empty. Its connection
// comes from acquire: a request's postgres.Acquire, which waits out a
// refusal for want of a slot, or a read ahead's
// postgres.AcquireUnlessNoSlot, which leaves the pool's connections to
// the requests then.
func (r *Reader) scanPages(ctx context.Context, acquire acquireFunc, q Query, owner pgtype.UUID, after *position, n int, newBody func() []byte) ([]scannedPage, error) {
	sql, args := listStatement(q, owner, after, n*q.Limit+1)
	conn, err := acquire(ctx, r.pool)
	if err != nil {
		return nil, fmt.Errorf("export: list: %w", err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("export: list: %w", err)
	}
	defer rows.Close()
	var (
		pages           = []scannedPage{{body: newBody()}}
		start           = len(pages[0].body) // where the last page's items begin in its body
		inPage          int                  // rows in the last page
		full            bool                 // the last page takes no more rows
		last            position
		id, status, doc pgtype.DriverBytes
		updated         time.Time
	)
	for rows.Next() {
		if full {
			// This row starts another page.
			end := last
			pages[len(pages)-1].next = &end
			if len(pages) == n {
				rows.Close()
				return pages, rows.Err()
			}
			pages = append(pages, scannedPage{body: newBody()})
			start, inPage, full = len(pages[len(pages)-1].body), 0, false
		}
		if err := rows.Scan(&id, &status, &updated, &doc); err != nil {
			return nil, fmt.Errorf("export: list: %w", err)
		}
		page := &pages[len(pages)-1]
		if inPage > 0 {
			page.body = append(page.body, ',')
		}
		page.body = catalog.Compose(page.body, statusOf(status), updated, doc)
		inPage++
		if full = inPage == q.Limit || len(page.body)-start >= r.maxPageBytes; full {
			// Copied now: id points into the driver's buffer, which the
			// next rows.Next reuses.
			last = position{UpdatedAt: updated, ID: string(id)}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("export: list: %w", err)
	}
	return pages, nil
}

// AppendItem appends one ExportItem to dst. An item of another owner is as
// not found as a missing one.
func (r *Reader) AppendItem(ctx context.Context, dst []byte, ownerID, itemID, lang string) ([]byte, error) {
	owner, err := catalog.ParseOwnerID(ownerID)
	if err != nil {
		return dst, fmt.Errorf("export: %w", err)
	}
	if !catalog.StorableItemID(itemID) {
		return dst, ErrNotFound
	}
	conn, err := postgres.Acquire(ctx, r.pool)
	if err != nil {
		return dst, fmt.Errorf("export: item: %w", err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, itemStatements[langIndex(lang)], owner, itemID)
	if err != nil {
		return dst, fmt.Errorf("export: item: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return dst, fmt.Errorf("export: item: %w", err)
		}
		return dst, ErrNotFound
	}
	var status, doc pgtype.DriverBytes
	var updated time.Time
	if err := rows.Scan(&status, &updated, &doc); err != nil {
		return dst, fmt.Errorf("export: item: %w", err)
	}
	return catalog.Compose(dst, statusOf(status), updated, doc), nil
}

// newSync draws the id of a new sync (never 0, which stands for none).
func newSync() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// statusOf maps the driver's bytes to a constant without allocating a string
// per row.
func statusOf(b []byte) string {
	if string(b) == catalog.StatusActive {
		return catalog.StatusActive
	}
	return catalog.StatusInactive
}
