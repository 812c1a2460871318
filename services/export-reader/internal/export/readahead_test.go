package export

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const testCursorSecret = "cursor-secret-0123456789abcdef012345"

// readAheadFor is read-ahead with a TTL no test outlives unless it says.
func readAheadFor(ttl time.Duration) ReadAhead {
	return ReadAhead{Pages: 16, TTL: ttl, Reads: 2, Timeout: 10 * time.Second}
}

func newTestReader(t *testing.T, pool *pgxpool.Pool, ahead ReadAhead) *Reader {
	t.Helper()
	cursors, err := cursor.New(testCursorSecret)
	if err != nil {
		t.Fatal(err)
	}
	return NewReader(pool, cursors, ahead)
}

// seededOwner creates an owner with n seeded items.
func seededOwner(t *testing.T, pool *pgxpool.Pool, n int) string {
	t.Helper()
	var owner string
	if err := pool.QueryRow(context.Background(), `INSERT INTO owners (name) VALUES ('read-ahead') RETURNING id::text`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Seed(context.Background(), pool, owner, n, 1); err != nil {
		t.Fatal(err)
	}
	return owner
}

// pageReader is one client following cursors, possibly over several readers.
type pageReader struct {
	t     *testing.T
	q     Query
	pages [][]byte
	done  bool
}

// next reads the next page from r.
func (c *pageReader) next(r *Reader) {
	c.t.Helper()
	body, next, err := r.AppendPage(context.Background(), nil, c.q)
	if err != nil {
		c.t.Fatalf("AppendPage(cursor %q): %v", c.q.Cursor, err)
	}
	c.pages = append(c.pages, body)
	c.q.Cursor, c.done = next, next == ""
}

func readAll(t *testing.T, r *Reader, q Query) [][]byte {
	t.Helper()
	c := &pageReader{t: t, q: q}
	for !c.done {
		c.next(r)
	}
	return c.pages
}

func outcome(r *Reader, result string) int {
	return int(testutil.ToFloat64(r.ahead.results.WithLabelValues(result)))
}

func TestReadAheadAnswersWhatTheDatabaseWould(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 300)
	for _, q := range []Query{
		{OwnerID: owner, Lang: "ENG", Limit: 7},
		{OwnerID: owner, Lang: "UKR", Limit: 100},
		{OwnerID: owner, Lang: "RUS", Limit: 13, Status: catalog.StatusActive},
	} {
		plain := readAll(t, newTestReader(t, pool, ReadAhead{}), q)
		ahead := newTestReader(t, pool, readAheadFor(time.Minute))
		got := readAll(t, ahead, q)
		if diff := cmp.Diff(plain, got); diff != "" {
			t.Errorf("pages of %+v with read-ahead differ from pages without (-without +with):\n%s", q, diff)
		}
		// Every page after the first was read ahead: a sequential client
		// waits for the page being read rather than reading it again.
		if hits := outcome(ahead, "hit"); hits != len(got)-1 {
			t.Errorf("%+v: %d pages, %d read-ahead hits, want %d", q, len(got), hits, len(got)-1)
		}
	}
}

func TestReadAheadNeverHidesAChange(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 50)
	r := newTestReader(t, pool, readAheadFor(time.Minute))
	var start time.Time // the sync's checkpoint, taken before it (spec 4.8)
	if err := pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	c := &pageReader{t: t, q: Query{OwnerID: owner, Lang: "ENG", Limit: 10}}
	c.next(r)
	waitReadAhead(t, r, c.q)

	// An item of page 2, already read ahead, changes now.
	changed := changeItem(t, pool, owner, 12)
	for !c.done {
		c.next(r)
	}
	// Page 2 came from before the change, as for a client that asked a
	// little sooner; the change carries a later updated_at, so the next
	// incremental sync from the checkpoint brings it (the same sync may too,
	// if its last pages were read after the change).
	if !bytes.Contains(c.pages[1], []byte(`"id":"`+changed+`"`)) {
		t.Errorf("page 2 lacks %s: it should be the page read before the change", changed)
	}
	incremental := readAll(t, r, Query{OwnerID: owner, Lang: "ENG", Limit: 10, UpdatedAfter: &start})
	var found bool
	var items int
	for _, page := range incremental {
		found = found || bytes.Contains(page, []byte(`"id":"`+changed+`"`))
		items += bytes.Count(page, []byte(`{"status":`))
	}
	if !found || items != 1 {
		t.Errorf("the incremental sync after the checkpoint has %d items, found %s: %v; want exactly that one (else the change was hidden)", items, changed, found)
	}
}

// A sync that starts after a change must see it, even when another sync
// with the same filters (an earlier attempt that failed and is repeated, as
// spec 4.8 asks, or another client of the owner) left pages read ahead
// before the change under the same positions: those answer only their own
// sync. Served to the new one, its last page would end the sync without the
// change, and the checkpoint taken at its start would hide it for good.
func TestReadAheadServesOnlyItsOwnSync(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 50)
	r := newTestReader(t, pool, readAheadFor(time.Minute))
	q := Query{OwnerID: owner, Lang: "ENG", Limit: 10}
	first := &pageReader{t: t, q: q}
	first.next(r) // page 1, then the client gives up; pages 2 and on are read ahead
	waitReadAhead(t, r, first.q)

	changeItem(t, pool, owner, 12) // an item of page 2 moves to the end
	again := readAll(t, r, q)      // the sync starts over, after the change
	fresh := readAll(t, newTestReader(t, pool, ReadAhead{}), q)
	if diff := cmp.Diff(fresh, again); diff != "" {
		t.Errorf("a sync started after the change differs from the database (-database +sync):\n%s", diff)
	}
}

// A page read ahead is held under its cursor alone (aheadKey has no
// owner), so only the cursor's check, before the read-ahead is asked, keeps
// another owner from being served it: owner B sending owner A's cursor,
// while A's next page waits in memory, is refused as any foreign cursor is,
// takes nothing, and A is still served that page. Both owners have the same
// item ids (one seed), as two tenants importing one supplier's catalog do.
func TestAPageReadAheadIsServedToNoOtherOwner(t *testing.T) {
	pool := testenv.Postgres(t)
	a, b := seededOwner(t, pool, 30), seededOwner(t, pool, 30)
	r := newTestReader(t, pool, readAheadFor(time.Minute))
	ctx := context.Background()
	ofA := &pageReader{t: t, q: Query{OwnerID: a, Lang: "ENG", Limit: 10}}
	ofA.next(r) // page 1; page 2 is read ahead under its cursor
	waitReadAhead(t, r, ofA.q)

	for _, q := range []Query{
		{OwnerID: b, Lang: "ENG", Limit: 10, Cursor: ofA.q.Cursor},
		{OwnerID: b, Lang: "ENG", Limit: 10, Cursor: ofA.q.Cursor, HeadOnly: true},
	} {
		body, next, err := r.AppendPage(ctx, nil, q)
		if !errors.Is(err, ErrInvalidCursor) || len(body) != 0 || next != "" {
			t.Errorf("owner B with owner A's cursor (HEAD %v) = %d bytes, next %q, %v; want nothing, ErrInvalidCursor",
				q.HeadOnly, len(body), next, err)
		}
	}
	if hits, misses := outcome(r, "hit"), outcome(r, "miss"); hits != 0 || misses != 0 {
		t.Errorf("after owner B's requests: %d read-ahead hits, %d misses; want none", hits, misses)
	}

	ofA.next(r)
	want := readAll(t, newTestReader(t, pool, ReadAhead{}), Query{OwnerID: a, Lang: "ENG", Limit: 10})[1]
	if diff := cmp.Diff(string(want), string(ofA.pages[1])); diff != "" || outcome(r, "hit") != 1 {
		t.Errorf("owner A's page 2 (read-ahead hits %d, want 1) differs from the database's (-database +served):\n%s",
			outcome(r, "hit"), diff)
	}
}

func TestReadAheadReadsAgainWhenStale(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 30)
	r := newTestReader(t, pool, readAheadFor(time.Millisecond))
	c := &pageReader{t: t, q: Query{OwnerID: owner, Lang: "ENG", Limit: 10}}
	c.next(r)
	waitReadAhead(t, r, c.q)
	time.Sleep(5 * time.Millisecond) // past the TTL
	changed := changeItem(t, pool, owner, 12)
	c.next(r)
	if bytes.Contains(c.pages[1], []byte(`"id":"`+changed+`"`)) {
		t.Errorf("page 2 holds %s, which moved to the end before it was asked for: a stale page was served", changed)
	}
	if got := outcome(r, "stale"); got != 1 {
		t.Errorf("stale outcomes = %d, want 1", got)
	}
}

func TestReadAheadAfterAnotherInstance(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 60)
	a := newTestReader(t, pool, readAheadFor(time.Minute))
	b := newTestReader(t, pool, readAheadFor(time.Minute))
	c := &pageReader{t: t, q: Query{OwnerID: owner, Lang: "ENG", Limit: 10}}
	c.next(a) // page 1 on a, which reads page 2 ahead for nothing
	c.next(b) // page 2 on b: a cursor b did not issue
	if got := len(b.ahead.pages); got != 1 {
		t.Fatalf("b holds %d entries after a miss, want 1 (the mark of its own cursor)", got)
	}
	c.next(b) // page 3: b issued the cursor but read nothing ahead
	c.next(b) // page 4: read ahead by b
	want := map[string]int{"miss": 1, "unread": 1, "hit": 1, "stale": 0, "failed": 0}
	got := map[string]int{}
	for result := range want {
		got[result] = outcome(b, result)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes on b (-want +got):\n%s", diff)
	}
}

func TestReadAheadKeepsAtMostPagesEntries(t *testing.T) {
	ra := newReadAhead(ReadAhead{Pages: 3, TTL: time.Minute, Timeout: time.Second})
	for i := range 50 {
		ra.mark(aheadKey{cursor: string(rune('a' + i)), lang: "ENG", limit: 10})
		if i%2 == 0 { // half of them are taken, as by their requests
			ra.take(aheadKey{cursor: string(rune('a' + i)), lang: "ENG", limit: 10})
		}
	}
	if len(ra.pages) > 3 {
		t.Errorf("%d entries held, want at most 3", len(ra.pages))
	}
	if len(ra.order) > 2*3+16 {
		t.Errorf("order holds %d keys for %d entries: taken keys are not compacted", len(ra.order), len(ra.pages))
	}
	if _, ok := ra.take(aheadKey{cursor: string(rune('a' + 49)), lang: "ENG", limit: 10}); !ok {
		t.Error("the newest entry was dropped")
	}
	if _, ok := ra.take(aheadKey{cursor: string(rune('a' + 1)), lang: "ENG", limit: 10}); ok {
		t.Error("an old entry outlived the bound")
	}
}

// A key entered again once its entry is spent (a client asking again and
// again with one cursor marks the same next cursor each time) is as new: it
// holds one slot of the order, and the slot it left does not drop it.
func TestReadAheadEntersAKeyAgainAsNew(t *testing.T) {
	key := func(c string) aheadKey { return aheadKey{cursor: c, lang: "ENG", limit: 10} }
	ra := newReadAhead(ReadAhead{Pages: 3, TTL: time.Minute, Timeout: time.Second})
	for range 1000 {
		ra.mark(key("again"))
	}
	if len(ra.pages) != 1 || len(ra.order) > 2*3+16 {
		t.Errorf("one key marked 1000 times: %d entries, %d keys in order; want 1 entry, at most %d keys",
			len(ra.pages), len(ra.order), 2*3+16)
	}

	ra = newReadAhead(ReadAhead{Pages: 2, TTL: time.Minute, Timeout: time.Second})
	ra.mark(key("a"))
	ra.mark(key("b"))
	ra.mark(key("a")) // spent (a mark), entered again: now the newest
	ra.mark(key("c")) // over the bound: the oldest, b, goes
	for c, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if _, got := ra.take(key(c)); got != want {
			t.Errorf("after a, b, a, c with room for 2: entry %s held = %v, want %v", c, got, want)
		}
	}
}

// waitReadAhead waits until the page after the client's position has been
// read ahead, so a test can change data after it for certain.
func waitReadAhead(t *testing.T, r *Reader, q Query) {
	t.Helper()
	r.ahead.mu.Lock()
	p, ok := r.ahead.pages[aheadKey{q.Cursor, q.Lang, q.Limit}]
	r.ahead.mu.Unlock()
	if !ok {
		t.Fatal("no page is being read ahead")
	}
	<-p.ready
}

// A client that paused longer than the TTL finds its pages stale; the chain
// started by its next request must replace the spent pages of the old one,
// so once the client is quick again it is served from memory again.
func TestReadAheadRecoversAfterAPause(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 100)
	r := newTestReader(t, pool, readAheadFor(200*time.Millisecond))
	c := &pageReader{t: t, q: Query{OwnerID: owner, Lang: "ENG", Limit: 10}}
	c.next(r)
	waitReadAhead(t, r, c.q)
	time.Sleep(400 * time.Millisecond) // every page read ahead is now past the TTL
	c.next(r)                          // page 2: stale, read by the request, which starts a new chain
	waitReadAhead(t, r, c.q)
	c.next(r) // page 3: from the new chain
	if stale, hits := outcome(r, "stale"), outcome(r, "hit"); stale != 1 || hits != 1 {
		t.Errorf("after a pause: %d stale, %d hits; want 1 stale (page 2) and 1 hit (page 3)", stale, hits)
	}
}

// changeItem flips the listing of owner's item at offset (in sync order) and
// stamps it now, as a sale would, which moves it to the end of the order.
func changeItem(t *testing.T, pool *pgxpool.Pool, owner string, offset int) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `
		UPDATE export_items SET listed_active = NOT listed_active, updated_at = clock_timestamp()
		WHERE (owner_id, id) = (SELECT owner_id, id FROM export_items WHERE owner_id = $1 ORDER BY updated_at, id OFFSET $2 LIMIT 1)
		RETURNING id`, owner, offset).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// Every outcome's series is exported from the start, at 0, so an alert on
// it has a series before the first such request.
func TestReadAheadSeriesStartAtZero(t *testing.T) {
	ra := newReadAhead(ReadAhead{Pages: 3, TTL: time.Minute, Timeout: time.Second})
	if n := testutil.CollectAndCount(ra.results); n != 5 {
		t.Errorf("%d read-ahead series before any request, want 5 (hit, stale, failed, unread, miss)", n)
	}
}

// What the read-ahead holds shows on the service's metrics, read at the
// scrape: its entries (a page read, a cursor marked) and the bytes of their
// pages, which a page taken by its request gives back.
func TestReadAheadHeldShowsOnMetrics(t *testing.T) {
	r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 3, TTL: time.Minute, Reads: 1, Timeout: time.Second})}
	registry := prometheus.NewRegistry()
	registry.MustRegister(r.Collectors()...)
	read := aheadKey{cursor: "read", lang: "ENG", limit: 10}
	r.ahead.add(read, &aheadPage{started: time.Now(), ready: closedReady, body: make([]byte, 1000)})
	r.ahead.mark(aheadKey{cursor: "marked", lang: "ENG", limit: 10})
	want := func(pages, bytes int) {
		t.Helper()
		if err := testutil.GatherAndCompare(registry, strings.NewReader(fmt.Sprintf(`
# HELP export_reader_read_ahead_bytes Bytes of the pages read ahead and held: at most EXPORT_READER_READ_AHEAD_PAGES × 128 KiB (393216 here), the oldest dropped first.
# TYPE export_reader_read_ahead_bytes gauge
export_reader_read_ahead_bytes %d
# HELP export_reader_read_ahead_pages Read-ahead entries held: pages read or being read ahead, and issued cursors marked to start it again; at most EXPORT_READER_READ_AHEAD_PAGES (3 here), the oldest dropped first.
# TYPE export_reader_read_ahead_pages gauge
export_reader_read_ahead_pages %d
`, bytes, pages)), "export_reader_read_ahead_pages", "export_reader_read_ahead_bytes"); err != nil {
			t.Error(err)
		}
	}
	want(2, 1000)
	if _, ok := r.ahead.take(read); !ok {
		t.Fatal("the page read ahead is not held")
	}
	want(1, 0)
}

// A HEAD gets no next cursor (no body): it starts no read-ahead, and one
// with a cursor leaves the page read ahead for the GET of that cursor.
func TestAHeadNeitherStartsNorTakesReadAhead(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 60)
	r := newTestReader(t, pool, readAheadFor(time.Minute))
	ctx := context.Background()
	get := Query{OwnerID: owner, Lang: "ENG", Limit: 10}
	head := get
	head.HeadOnly = true
	if _, _, err := r.AppendPage(ctx, nil, head); err != nil {
		t.Fatal(err)
	}
	if n := len(r.ahead.pages); n != 0 {
		t.Errorf("a HEAD of the first page left %d read-ahead entries, want none", n)
	}
	_, next, err := r.AppendPage(ctx, nil, get) // page 1, page 2 read ahead
	if err != nil || next == "" {
		t.Fatalf("page 1: next %q, %v", next, err)
	}
	head.Cursor, get.Cursor = next, next
	for _, q := range []Query{head, get} {
		if _, _, err := r.AppendPage(ctx, nil, q); err != nil {
			t.Fatal(err)
		}
	}
	if hits, misses := outcome(r, "hit"), outcome(r, "miss"); hits != 1 || misses != 0 {
		t.Errorf("HEAD then GET of page 2: %d read-ahead hits, %d misses; want the GET's hit", hits, misses)
	}
}

// Pages of large items (a page may reach MaxPageBytes) are held within the
// bytes of Pages ordinary ones: counted in pages alone, syncs of such
// items held hundreds of megabytes. Both the pages a chain reads and those
// entered already read are counted, and a page taken gives its bytes back.
func TestReadAheadHoldsAtMostPagesWorthOfBytes(t *testing.T) {
	const pages = 4
	budget := pages * pageBufferSize
	ra := newReadAhead(ReadAhead{Pages: pages, TTL: time.Minute, Reads: 64, Timeout: time.Second})
	big := bytes.Repeat([]byte("x"), budget/3+1) // three of them are over the budget
	fetch := func(_ context.Context, after position, n int) ([]scannedPage, error) {
		out := make([]scannedPage, n)
		for i := range out {
			next := position{ID: after.ID + "+"}
			out[i] = scannedPage{body: bytes.Clone(big), next: &next}
			after = next
		}
		return out, nil
	}
	for sync := range 8 { // eight syncs, each reading ahead from its first page
		c := &chain{fetch: fetch, cursor: func(p position) string { return p.ID }, lang: "ENG", limit: 100}
		ra.begin(context.Background(), c, position{ID: fmt.Sprint(sync)}, fmt.Sprint(sync))
		deadline := time.Now().Add(5 * time.Second)
		for len(ra.slots) > 0 && time.Now().Before(deadline) { // until the chain pauses
			time.Sleep(time.Millisecond)
		}
		ra.mu.Lock()
		held, counted := 0, ra.bytes
		for _, p := range ra.pages {
			held += len(p.body)
		}
		ra.mu.Unlock()
		if held > budget || counted != held {
			t.Fatalf("after %d syncs: %d bytes held (%d counted), want them counted and at most %d", sync+1, held, counted, budget)
		}
	}
	ra.mu.Lock()
	keys := slices.Collect(maps.Keys(ra.pages))
	ra.mu.Unlock()
	if len(keys) == 0 {
		t.Fatal("no page held: the newest ones must stay")
	}
	for _, k := range keys {
		ra.take(k)
	}
	if ra.bytes != 0 {
		t.Errorf("%d bytes counted once every page was taken, want 0", ra.bytes)
	}
}

// A page read ahead that went stale (its client slower than the TTL) and
// is replaced under its key gives its bytes back: counted on, they would
// pile up with every replacement until the count alone passed the bound
// and every page was dropped as soon as it was read, read-ahead off for
// good without a sign.
func TestReadAheadReplacingAStalePageGivesItsBytesBack(t *testing.T) {
	key := aheadKey{cursor: "c", lang: "ENG", limit: 100}
	ra := newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Second})
	stale := &aheadPage{started: time.Now().Add(-time.Hour), ready: closedReady, body: make([]byte, 1000)}
	if !ra.add(key, stale) || ra.bytes != 1000 {
		t.Fatalf("a page entered already read: %d bytes counted, want 1000", ra.bytes)
	}
	fresh := &aheadPage{started: time.Now(), ready: closedReady, body: make([]byte, 10)}
	if !ra.add(key, fresh) {
		t.Fatal("the stale page was not replaced")
	}
	if ra.bytes != 10 {
		t.Errorf("%d bytes counted after the stale page was replaced, want the new page's 10", ra.bytes)
	}
	ra.take(key)
	if ra.bytes != 0 {
		t.Errorf("%d bytes counted once the page was taken, want 0", ra.bytes)
	}
}

// A page is read ahead only while a list page may be served (the Reader's
// RefuseListsUnless): a page read while the read replica lagged beyond
// READ_MAX_LAG, then asked for once it had caught up, was served from
// memory without the request's check, so a sync could end on a page that
// lacked what the replica had not replayed yet, and its checkpoint skip it.
func TestAPageIsNotReadAheadWhileTheReplicaIsBehind(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 30)
	cursors, err := cursor.New(testCursorSecret)
	if err != nil {
		t.Fatal(err)
	}
	var checks atomic.Int32
	var behind atomic.Bool
	fresh := func() error {
		// The first check is page 1's own, made before the lag grows.
		if checks.Add(1) > 1 && behind.Load() {
			return errors.New("behind")
		}
		return nil
	}
	behind.Store(true)
	r := NewReader(pool, cursors, readAheadFor(time.Minute), RefuseListsUnless(fresh))
	c := &pageReader{t: t, q: Query{OwnerID: owner, Lang: "ENG", Limit: 10}}
	c.next(r)
	waitReadAhead(t, r, c.q) // page 2's read, while the replica is behind
	behind.Store(false)      // caught up
	c.next(r)
	if hits, unread := outcome(r, "hit"), outcome(r, "unread"); hits != 0 || unread != 1 {
		t.Errorf("page 2, asked for while the replica was behind: %d read-ahead hits, %d unread; want 0 and 1 (read by its request)", hits, unread)
	}
}

// A read ahead started once the reader has stopped (a page answered by a
// request the drain cut off, or by one ending as it stopped) sends no
// query: StopReadingAhead said such reads fail at once, but the cancel
// that context.AfterFunc runs on a context already done runs in a
// goroutine of its own, so the read took a pool connection and sent its
// query first, and a fetch that answered before that goroutine ran read
// the chain on. Stopping twice, and before any read, is fine.
func TestAReadAheadStartedOnceStoppedReadsNothing(t *testing.T) {
	r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Hour})}
	r.StopReadingAhead()
	r.StopReadingAhead()
	var fetched atomic.Int32
	fetch := func(_ context.Context, after position, _ int) ([]scannedPage, error) {
		fetched.Add(1)
		next := position{ID: after.ID + "+"}
		return []scannedPage{{body: []byte("{}"), next: &next}}, nil
	}
	c := &chain{fetch: fetch, cursor: func(p position) string { return p.ID }, lang: "ENG", limit: 100}
	r.ahead.begin(context.Background(), c, position{ID: "1"}, "1")
	p, ok := r.ahead.take(aheadKey{cursor: "1", lang: "ENG", limit: 100})
	if !ok {
		t.Fatal("the page after the one answered has no entry")
	}
	if hit, err := r.ahead.use(context.Background(), p); hit || err != nil {
		t.Errorf("its request: hit %v, error %v; want it to read the page itself", hit, err)
	}
	waitForFreeSlots(t, r.ahead)
	if n := fetched.Load(); n != 0 {
		t.Errorf("%d queries sent by reads ahead started once the reader had stopped, want none", n)
	}
}

// A request waiting for a page read ahead when the reader stops (one the
// drain gave up on) gets its answer: the read it waits for ends, failed,
// and the request reads the page itself (under its own context, which
// the drain cut off: httpserver's 503), neither waiting out the read's
// bound nor taking a page that is not there.
func TestStoppingEndsTheReadAheadARequestWaitsFor(t *testing.T) {
	r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Hour})}
	started := make(chan struct{})
	fetch := func(ctx context.Context, _ position, _ int) ([]scannedPage, error) {
		close(started)
		<-ctx.Done() // a lock held past the drain
		return nil, ctx.Err()
	}
	c := &chain{fetch: fetch, cursor: func(p position) string { return p.ID }, lang: "ENG", limit: 100}
	r.ahead.begin(context.Background(), c, position{ID: "1"}, "1")
	<-started
	p, ok := r.ahead.take(aheadKey{cursor: "1", lang: "ENG", limit: 100})
	if !ok {
		t.Fatal("the page being read ahead has no entry")
	}
	r.StopReadingAhead()
	// Not a timing: a bound on the wait, so that a read left running
	// fails the test instead of hanging it for the read's hour.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if hit, err := r.ahead.use(ctx, p); hit || err != nil {
		t.Errorf("the request waiting for it: hit %v, error %v; want it to read the page itself", hit, err)
	}
	if n := outcome(r, "failed"); n != 1 {
		t.Errorf("%v reads ahead counted failed, want 1", n)
	}
	waitForFreeSlots(t, r.ahead)
}

// waitForFreeSlots waits until no read ahead holds a background slot: every
// chain ended or paused.
func waitForFreeSlots(t *testing.T, ra *readAhead) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(ra.slots) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a read ahead still holds its slot")
		}
		time.Sleep(time.Millisecond)
	}
}
