package export

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ReadAhead configures the read-ahead of list pages.
//
// A client syncing a catalog asks for its pages one after another: it waits
// for page N, stores it, then asks for page N+1 with meta.next_cursor. Served
// plainly, every page costs the client a full PostgreSQL round trip on top of
// the HTTP exchange. With read-ahead, the reader starts reading page N+1 in
// the background as soon as page N is answered, so the database works while
// the page travels to the client and the next request usually finds its page
// ready (or nearly so) in memory.
//
// Keyset pages can only be read in order (page N+1 starts after page N's
// last row), so the reads of one sync form a chain: when a read ends, the
// next one starts at once, as long as fewer than aheadDepth pages wait for
// their requests. The database then reads page N+2 while page N+1 travels,
// and a sync runs at the pace of the slower of the two, not of their sum.
//
// A page read ahead is a snapshot taken a little before the client asks for
// it: the same as a slightly faster client would have seen. Every item that
// changes afterwards moves behind the client's position (updated_at moves
// forward) and arrives later in the same sync, so nothing is missed; a page
// older than TTL is read again instead. That reasoning needs the snapshot to
// be younger than the sync, so pages answer only the sync that caused their
// read: cursors carry the sync's id (cursor.Position.Sync), and entries are
// keyed by cursor. A sync that starts over, or another client with the same
// filters, reads its own pages.
type ReadAhead struct {
	// Pages bounds the pages held at once (each in a recycled buffer of at
	// least 128 KB), and their bytes to as many buffers' worth
	// (pageBufferSize each): the oldest is dropped first. 0 turns
	// read-ahead off.
	Pages int
	// TTL is how long a page read ahead may wait for its request.
	TTL time.Duration
	// Reads bounds the background reads at once, so read-ahead never takes
	// every pooled connection from the requests themselves. 0 turns
	// read-ahead off.
	Reads int
	// Timeout bounds one background read.
	Timeout time.Duration
}

// startSpan starts a span with the tracer of ctx's span's provider (the
// process's, which the request's server span came from), so that a read
// ahead and the request waiting for it are recorded where the request is.
func startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().
		Tracer("github.com/coinexport/export/services/export-reader/internal/export").Start(ctx, name)
}

// aheadDepth is how many pages of one sync may be read, or being read,
// before their requests come, and aheadBatch how many of them one query
// reads: a query's fixed cost (round trip, executor start) is a quarter of a
// 100-item page's, so reading two pages at once makes each page cheaper than
// the client's own request for it.
const (
	aheadDepth = 4
	aheadBatch = 2
)

// errNotRead marks an entry whose page was not read ahead: every background
// slot was busy, the request that issued its cursor was itself a miss, or
// the database was not fresh enough to serve a list page then (chain.fresh).
// Its request reads the page itself.
var errNotRead = errors.New("export: page not read ahead")

// aheadKey is what must match for a page read ahead to answer a request: the
// cursor (which is bound to the owner and the filters) and the two
// parameters that may change between pages.
type aheadKey struct {
	cursor string
	lang   string
	limit  int
}

// aheadPage is one page read (or being read) ahead.
type aheadPage struct {
	chain   *chain
	seq     uint64 // set by add, under readAhead.mu
	after   position
	started time.Time
	ready   chan struct{} // closed once body, next, nextCursor and err are set
	body    []byte        // the items, comma-separated, as scan appends them
	key     aheadKey      // set by add, under readAhead.mu
	charged int           // the bytes of body counted in readAhead.bytes while held
	next    *position     // nil on the last page
	// nextCursor is the cursor of the page after this one ("" on the last).
	nextCursor string
	err        error
	// readSpan is the span of the read that fills the page (in the trace
	// of the request that started it), set before ready is closed: the
	// span of a request that waited for the page links to it.
	readSpan trace.SpanContext
}

// fetchFunc reads up to n pages after a position in one query.
type fetchFunc func(ctx context.Context, after position, n int) ([]scannedPage, error)

// pageBuffers recycles the bodies of pages read ahead: a page of 100 items
// is ~100 KB, and growing a fresh slice to that size for every page (then
// collecting it) cost more CPU than reading the page.
var pageBuffers = sync.Pool{New: func() any { b := make([]byte, 0, pageBufferSize); return &b }}

// pageBufferSize is a recycled page buffer's size, and the bytes each of
// ReadAhead.Pages allows the pages held: a page of large items (up to
// MaxPageBytes, 4 MiB, and the item that passed it) counts as the many
// ordinary pages it weighs, so the default 256 pages hold 32 MiB at most.
// Counted in pages alone, a sync of such items held about 100 MB and a
// few at once over 600 MB, past the Deployment's memory limit.
const pageBufferSize = 128 << 10

func newPageBuffer() []byte { return (*pageBuffers.Get().(*[]byte))[:0] }

// release returns the body of a page that was copied out to the pool.
func (p *aheadPage) release() {
	b := p.body[:0]
	p.body = nil
	if cap(b) <= 1<<20 { // let a rare huge page go instead of pinning it
		pageBuffers.Put(&b)
	}
}

// chain is the read-ahead of one sync: the pages read one after another.
type chain struct {
	ra     *readAhead
	fetch  fetchFunc
	cursor func(position) string // encodes the cursor of a position
	// fresh is the Reader's check that the database may serve a list page
	// (RefuseListsUnless; nil: always). A page read ahead answers its
	// request without that request's check, so it is asked before each
	// read: a page read while a replica lagged beyond READ_MAX_LAG, then
	// served once it had caught up (within the TTL), could end a sync
	// that missed what the replica lacked.
	fresh func() error
	lang  string
	limit int

	mu      sync.Mutex
	ctx     context.Context // of the latest request of the sync: its trace gets the reads it causes
	untaken int             // pages read or being read that no request took yet
	paused  *aheadPage      // the last page read, when its successor waits for a take
}

// readAhead holds the pages read ahead, keyed by the cursor that asks for
// them. An entry also records that this reader issued the cursor: a request
// whose cursor this reader did not issue (another instance served the page
// before) reads no page ahead but marks its own next cursor, so readers
// behind a balancer without affinity waste at most one page per sync, and a
// sync that moved to this reader is read ahead again from its second page
// here.
type readAhead struct {
	cfg   ReadAhead
	slots chan struct{}
	// stopped ends every read in the background once the reader stops
	// (stop): no request will ask for its pages.
	stopped context.Context
	stop    context.CancelFunc
	results *prometheus.CounterVec
	// gauges are those of what is held (entries, bytes), read at the
	// scrape under mu: at their bound, flat, the set is full by design.
	gauges []prometheus.Collector

	mu    sync.Mutex
	pages map[aheadKey]*aheadPage
	bytes int       // of the bodies of the pages held (aheadPage.charged)
	order []entered // oldest first
	seq   uint64    // of the last entry
}

// entered is an entry of readAhead.order: the key and the seq of the page
// entered under it. A key entered again (its entry spent) has one slot per
// entry; only the slot of the page still held under it counts, so an old
// slot neither drops the new page nor stays in order with it.
type entered struct {
	key aheadKey
	seq uint64
}

func newReadAhead(cfg ReadAhead) *readAhead {
	stopped, stop := context.WithCancel(context.Background())
	ra := &readAhead{
		cfg:     cfg,
		slots:   make(chan struct{}, max(cfg.Reads, 0)),
		stopped: stopped,
		stop:    stop,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "export_reader_read_ahead_total",
			Help: "List requests with a cursor by read-ahead outcome: hit (answered from the page read ahead), stale (read ahead longer than the TTL ago: read again), failed (the background read failed: read again), unread (not read ahead: no free slot, the previous page was a miss, or the read replica was behind), miss (this reader did not serve the previous page).",
		}, []string{"result"}),
		pages: map[aheadKey]*aheadPage{},
	}
	ra.gauges = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "export_reader_read_ahead_pages",
			Help: fmt.Sprintf("Read-ahead entries held: pages read or being read ahead, and issued cursors marked to start it again; at most EXPORT_READER_READ_AHEAD_PAGES (%d here), the oldest dropped first.", max(cfg.Pages, 0)),
		}, func() float64 { return float64(ra.heldPages()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "export_reader_read_ahead_bytes",
			Help: fmt.Sprintf("Bytes of the pages read ahead and held: at most EXPORT_READER_READ_AHEAD_PAGES × 128 KiB (%d here), the oldest dropped first.", max(cfg.Pages, 0)*pageBufferSize),
		}, func() float64 { return float64(ra.heldBytes()) }),
	}
	// Every outcome's series exists from the start, at 0: an alert on a
	// rate or a ratio has its series before the first such request.
	for _, result := range []string{"hit", "stale", "failed", "unread", "miss"} {
		ra.results.WithLabelValues(result)
	}
	return ra
}

// heldPages is how many entries are held, and heldBytes the bytes of their
// pages.
func (ra *readAhead) heldPages() int {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return len(ra.pages)
}

func (ra *readAhead) heldBytes() int {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return ra.bytes
}

func (ra *readAhead) enabled() bool { return ra.cfg.Pages > 0 && ra.cfg.Reads > 0 }

// begin starts a new chain at the page after pos, whose cursor is
// posCursor; ctx is the request that issued that cursor.
func (ra *readAhead) begin(ctx context.Context, c *chain, pos position, posCursor string) {
	c.ra, c.ctx = ra, ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	c.startLocked(pos, posCursor)
}

// mark records that this reader issued the cursor of key without reading
// its page, so a request with it (same client, same instance) starts the
// read-ahead again.
func (ra *readAhead) mark(key aheadKey) {
	ra.add(key, &aheadPage{started: time.Now(), ready: closedReady, err: errNotRead})
}

// take removes and returns the entry for key, if this reader made one.
func (ra *readAhead) take(key aheadKey) (*aheadPage, bool) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	p, ok := ra.pages[key]
	if ok {
		ra.dropLocked(key)
	}
	return p, ok
}

// dropLocked removes the entry of key and its bytes. ra.mu is held.
func (ra *readAhead) dropLocked(key aheadKey) {
	if p, ok := ra.pages[key]; ok {
		ra.bytes -= p.charged
		p.charged = 0
		delete(ra.pages, key)
	}
}

// chargeLocked counts the body of p, read since it was entered, while p is
// held, and drops the oldest entries over the bound. ra.mu is held.
func (ra *readAhead) chargeLocked(p *aheadPage) {
	if held, ok := ra.pages[p.key]; !ok || held != p || p.charged != 0 {
		return
	}
	p.charged = len(p.body)
	ra.bytes += p.charged
	ra.dropOldestLocked()
}

// charge is chargeLocked for a caller without ra.mu.
func (ra *readAhead) charge(p *aheadPage) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	ra.chargeLocked(p)
}

// dropOldestLocked drops the oldest entries while more pages, or more
// bytes, are held than the bound allows. ra.mu is held.
func (ra *readAhead) dropOldestLocked() {
	for (len(ra.pages) > ra.cfg.Pages || ra.bytes > ra.cfg.Pages*pageBufferSize) && len(ra.order) > 0 {
		if e := ra.order[0]; ra.held(e) {
			ra.dropLocked(e.key)
		}
		ra.order = ra.order[1:]
	}
}

// add records p under key, dropping the oldest entries over the bound;
// false when key already has an entry.
func (ra *readAhead) add(key aheadKey, p *aheadPage) bool {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if old, ok := ra.pages[key]; ok && !old.spent(ra.cfg.TTL) {
		return false
	}
	ra.dropLocked(key) // a spent entry, replaced
	ra.seq++
	p.seq, p.key = ra.seq, key
	ra.pages[key] = p
	ra.order = append(ra.order, entered{key, p.seq})
	ra.chargeLocked(p) // a page entered already read; drops over the bound
	ra.dropOldestLocked()
	// Taken and replaced entries leave their slot in order; compact once
	// it is mostly such slots, so order stays proportional to the entries
	// held. (A client asking again and again with one cursor replaces the
	// same spent entry each time.)
	if len(ra.order) > 2*ra.cfg.Pages+16 {
		live := ra.order[:0]
		for _, e := range ra.order {
			if ra.held(e) {
				live = append(live, e)
			}
		}
		clear(ra.order[len(live):])
		ra.order = live
	}
	return true
}

// held reports whether e's page is still the entry under its key.
// ra.mu is held.
func (ra *readAhead) held(e entered) bool {
	p, ok := ra.pages[e.key]
	return ok && p.seq == e.seq
}

// spent reports whether p can no longer answer its request: read (or
// marked) and failed, unread or older than ttl. A new chain may replace it;
// otherwise a client slower than the TTL would have each page read twice,
// once ahead for nothing and once by its own request.
func (p *aheadPage) spent(ttl time.Duration) bool {
	select {
	case <-p.ready:
		return p.err != nil || time.Since(p.started) > ttl
	default:
		return false // being read
	}
}

// use waits for p and reports whether its page can answer the request now:
// read without error and not older than the TTL. The outcome is counted. A
// page that answers is taken from its chain, which may read on.
//
// A request that finds its page still being read waits under a span of its
// own, "export read-ahead wait", linked to the read's span (in the trace of
// the request that started it) and saying how the read ended
// (export.read_ahead.result, a failed read's error as an exception). Without it a
// request that waited out a read stuck behind a lock showed its server span
// 10 s long, 9 s of it in no span, and then its own statement timed out in
// the second left.
func (ra *readAhead) use(ctx context.Context, p *aheadPage) (bool, error) {
	wait, err := awaitRead(ctx, p)
	if err != nil {
		return false, err
	}
	result, hit := ra.outcome(ctx, p)
	if wait != nil {
		// An unread page is no failure: no slot was free, or the replica
		// was behind, and the request reads it itself. The result says so.
		if p.err != nil && result != "unread" {
			wait.RecordError(p.err)
		}
		wait.SetAttributes(attribute.String("export.read_ahead.result", result))
		wait.End()
	}
	return hit, nil
}

// awaitRead waits until p is read or ctx ends. When p is still being read it
// returns the span of the wait, which the caller ends.
func awaitRead(ctx context.Context, p *aheadPage) (trace.Span, error) {
	select {
	case <-p.ready:
		return nil, nil
	default:
	}
	_, wait := startSpan(ctx, "export read-ahead wait")
	select {
	case <-p.ready:
	case <-ctx.Done():
		wait.SetAttributes(attribute.String("export.read_ahead.result", "abandoned"))
		wait.SetStatus(codes.Error, "the request ended while the page was being read ahead")
		wait.End()
		return nil, ctx.Err()
	}
	if p.readSpan.IsValid() {
		wait.AddLink(trace.Link{SpanContext: p.readSpan})
	}
	return wait, nil
}

// outcome counts how p, read, can serve its request (hit, failed, unread or
// stale), and takes a hit from its chain.
func (ra *readAhead) outcome(ctx context.Context, p *aheadPage) (string, bool) {
	var result string
	switch {
	case errors.Is(p.err, errNotRead):
		result = "unread"
	case p.err != nil:
		result = "failed"
	case time.Since(p.started) > ra.cfg.TTL:
		result = "stale"
	default:
		result = "hit"
	}
	ra.results.WithLabelValues(result).Inc()
	if result == "hit" {
		p.chain.taken(ctx)
	}
	return result, result == "hit"
}

// startLocked starts reading the page after pos (cursor posCursor) unless
// the reader already has an entry for it, when a background slot is free.
// c.mu is held.
func (c *chain) startLocked(pos position, posCursor string) {
	select {
	case c.ra.slots <- struct{}{}:
		if !c.readLocked(pos, posCursor) {
			<-c.ra.slots
		}
	default:
		c.ra.mark(aheadKey{posCursor, c.lang, c.limit})
	}
}

// readLocked enters the page after pos and reads it in the background on a
// slot the caller holds; false (the slot still the caller's) when the reader
// already has an entry for it. c.mu is held.
func (c *chain) readLocked(pos position, posCursor string) bool {
	p := &aheadPage{chain: c, after: pos, started: time.Now(), ready: make(chan struct{})}
	if !c.ra.add(aheadKey{posCursor, c.lang, c.limit}, p) {
		return false
	}
	c.untaken++
	go c.read(c.ctx, p)
	return true
}

// read fills p, and the pages after it that the same query read, on the
// slot it was given, then announces p. The entries of the pages after p are
// made before p is announced: the client's request for the next page can
// only follow p's answer, so it always finds its entry (or a mark).
func (c *chain) read(ctx context.Context, p *aheadPage) {
	tail := c.fill(ctx, p)
	slotPassedOn := false
	c.mu.Lock()
	switch {
	case tail == nil:
		// The chain ends; a request reading the page itself starts anew.
	case c.untaken < aheadDepth:
		slotPassedOn = c.readLocked(*tail.next, tail.nextCursor)
	default:
		c.paused = tail
	}
	c.mu.Unlock()
	if !slotPassedOn {
		<-c.ra.slots
	}
	close(p.ready)
}

// fill reads p and up to aheadBatch-1 pages after it, entering those as
// ready, and returns the last page read when another page follows it.
func (c *chain) fill(ctx context.Context, p *aheadPage) *aheadPage {
	if c.fresh != nil && c.fresh() != nil {
		p.err = errNotRead // its request reads the page itself, under its own check
		return nil
	}
	// The read's spans join the trace of the request that caused it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.ra.cfg.Timeout)
	defer cancel()
	unregister := context.AfterFunc(c.ra.stopped, cancel)
	defer unregister()
	// On a reader already stopped, AfterFunc cancels in a goroutine of its
	// own: without this check the read took a connection and sent its
	// query first, and one answered before that goroutine ran read on.
	if err := c.ra.stopped.Err(); err != nil {
		p.err = err
		return nil
	}
	ctx, span := startSpan(ctx, "export read-ahead")
	defer span.End()
	p.readSpan = span.SpanContext()
	pages, err := c.fetch(ctx, p.after, aheadBatch)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "read-ahead failed")
		p.err = err
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fillPage(p, pages[0])
	c.ra.charge(p)
	for _, sp := range pages[1:] {
		if p.next == nil {
			break
		}
		// Whole before it is entered: its request may come at once.
		page := &aheadPage{chain: c, after: *p.next, started: p.started, ready: closedReady}
		c.fillPage(page, sp)
		if !c.ra.add(aheadKey{p.nextCursor, c.lang, c.limit}, page) {
			page.release()
			return nil // another chain has it; this one ends here
		}
		c.untaken++
		p = page
	}
	if p.next == nil {
		return nil
	}
	return p
}

func (c *chain) fillPage(p *aheadPage, sp scannedPage) {
	p.body, p.next = sp.body, sp.next
	if p.next != nil {
		p.nextCursor = c.cursor(*p.next)
	}
}

// closedReady is the ready channel of pages entered already read.
var closedReady = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// taken records that a request took one of the chain's pages; a paused chain
// reads on.
func (c *chain) taken(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.untaken--
	c.ctx = ctx
	if p := c.paused; p != nil && c.untaken < aheadDepth {
		c.paused = nil
		c.startLocked(*p.next, p.nextCursor)
	}
}
