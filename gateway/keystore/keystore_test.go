package keystore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// insertKey stores a key and returns its secret and id.
func insertKey(t *testing.T, pool *pgxpool.Pool, owner string, scopes []string) (string, string) {
	t.Helper()
	secret, prefix, err := apikey.Generate(scopes)
	if err != nil {
		t.Fatal(err)
	}
	h := apikey.HashOf(secret)
	var id string
	err = pool.QueryRow(context.Background(), `INSERT INTO api_keys (owner_id, prefix, hash, scopes) VALUES ($1, $2, $3, $4) RETURNING id`,
		owner, prefix, h[:], scopes).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return secret, id
}

func newOwner(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `INSERT INTO owners (name) VALUES ('o') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// counting returns a store whose cache hits and misses are counted.
func counting(pool *pgxpool.Pool, opts Options) (*Store, *atomic.Int64, *atomic.Int64) {
	var hits, misses atomic.Int64
	opts.OnLookup = func(hit bool) {
		if hit {
			hits.Add(1)
		} else {
			misses.Add(1)
		}
	}
	return New(pool, opts), &hits, &misses
}

func TestLookup(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	secret, id := insertKey(t, pool, owner, []string{"export:read"})
	revoked, revokedID := insertKey(t, pool, owner, []string{"export:read"})
	if _, err := pool.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, revokedID); err != nil {
		t.Fatal(err)
	}
	unknown, _, _ := apikey.Generate([]string{"export:read"})
	store, hits, misses := counting(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100})
	ctx := context.Background()

	got, err := store.Lookup(ctx, secret, nil)
	want := Key{ID: id, OwnerID: owner, Scopes: []string{"export:read"}}
	if err != nil || !cmp.Equal(got, want) {
		t.Fatalf("Lookup(valid) = %+v, %v, want %+v", got, err, want)
	}
	for _, tt := range []struct {
		name, secret string
		cause        error
		keyID        string // named with the refusal
	}{
		{"revoked", revoked, ErrRevokedKey, revokedID}, {"unknown", unknown, ErrUnknownKey, ""},
		{"malformed", "cxr_x", ErrMalformedKey, ""}, {"empty", "", ErrMissingKey, ""},
	} {
		key, err := store.Lookup(ctx, tt.secret, nil)
		if !errors.Is(err, ErrUnauthenticated) || !errors.Is(err, tt.cause) || key.ID != tt.keyID {
			t.Errorf("Lookup(%s) = %+v, %v; want ErrUnauthenticated, as %v, with key id %q", tt.name, key, err, tt.cause, tt.keyID)
		}
	}
	// Malformed keys never reach the cache or the database: 3 misses so far.
	if hits.Load() != 0 || misses.Load() != 3 {
		t.Errorf("hits/misses = %d/%d, want 0/3", hits.Load(), misses.Load())
	}
	// Found and unknown keys are both cached.
	for _, s := range []string{secret, unknown, revoked} {
		store.Lookup(ctx, s, func() bool { t.Error("mayFetch asked on a cached key"); return true })
	}
	if hits.Load() != 3 {
		t.Errorf("cache hits after repeating 3 lookups = %d, want 3", hits.Load())
	}
}

func TestLookupAsksBeforeFetching(t *testing.T) {
	pool := testenv.Postgres(t)
	store := New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100})
	unknown, _, _ := apikey.Generate([]string{"export:read"})
	if _, err := store.Lookup(context.Background(), unknown, func() bool { return false }); !errors.Is(err, ErrThrottled) {
		t.Fatalf("Lookup with mayFetch refusing = %v, want ErrThrottled", err)
	}
}

// A lookup that PostgreSQL does not answer (api_keys locked, as by a
// migration waiting for its lock) fails within LookupTimeout, as an error
// that is no refusal of the key, instead of waiting for the lock.
func TestLookupGivesUpAfterLookupTimeout(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	lockKeys(t, pool)
	store := New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100, LookupTimeout: 200 * time.Millisecond})
	secret, _, _ := apikey.Generate([]string{"export:read"})
	done := make(chan error, 1)
	go func() {
		_, err := store.Lookup(ctx, secret, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, ErrUnauthenticated) {
			t.Errorf("Lookup(api_keys locked) = %v, want an error that is not a refusal of the key", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lookup(api_keys locked) still waiting after 10 s; LookupTimeout is 200 ms")
	}
}

// With PostgreSQL out of connection slots (the gateways' and services'
// pools together past max_connections; here the role's CONNECTION LIMIT),
// a lookup that finds the pool's one connection busy is refused the new
// one the pool asks for (53300): it waits for the pool's own, within
// LookupTimeout, and finds the key. It failed at once, and the request of
// an uncached key was answered 503 though the connection came free a
// moment later.
func TestLookupWaitsForThePoolsConnectionWhenNoSlotIsLeft(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	admin := testenv.Pool(t, url)
	secret, id := insertKey(t, admin, newOwner(t, admin), []string{"export:read"})
	dsn, limit := testenv.SlotLimitedRole(t, url)
	pool, err := postgres.Open(ctx, dsn+" pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	limit(1) // the pool's one session holds the role's one slot
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store := New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100, LookupTimeout: time.Minute})
	done := make(chan error, 1)
	go func() { done <- lookUpAs(ctx, store, secret, id) }()
	// Until the lookup waits for the connection held, or has failed.
	for waits := int64(0); waits == 0 && len(done) == 0; waits, _ = postgres.SlotWaits(pool) {
		time.Sleep(time.Millisecond)
	}
	held.Release()
	if err := <-done; err != nil {
		t.Errorf("Lookup while the pool's connection was busy and no slot left = %v, want the key", err)
	}
}

// lockKeys locks api_keys until the returned transaction ends (at the
// test's end at the latest), so that lookups wait.
func lockKeys(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	return testenv.InTransaction(t, pool, `LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`)
}

// keyBehindLock returns a store, a valid key (its secret and id) not yet
// cached, and the transaction holding api_keys locked: lookups wait until
// it ends.
func keyBehindLock(t *testing.T) (*Store, pgx.Tx, string, string) {
	t.Helper()
	pool := testenv.Postgres(t)
	secret, id := insertKey(t, pool, newOwner(t, pool), []string{"export:read"})
	tx := lockKeys(t, pool)
	return New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100, LookupTimeout: 10 * time.Second}), tx, secret, id
}

// lookupsWaiting counts the key lookups waiting in PostgreSQL behind tx's
// lock, asked on tx's connection: the pool's may all be taken.
func lookupsWaiting(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	ctx := context.Background()
	var n int
	// A transaction sees one snapshot of the statistics unless told.
	if _, err := tx.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND wait_event_type = 'Lock'`,
		lookupSQL).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// lookUpAs looks secret up and reports an error unless it is the key id.
func lookUpAs(ctx context.Context, store *Store, secret, id string) error {
	key, err := store.Lookup(ctx, secret, nil)
	if err == nil && key.ID != id {
		err = fmt.Errorf("key %q, want %q", key.ID, id)
	}
	return err
}

// Concurrent misses of one key make one query: after the cache is emptied
// (the listener reconnected, PostgreSQL just back), every request of a busy
// key misses at once, and each used to queue a query of its own on the
// gateway's few connections.
func TestConcurrentMissesOfAKeyShareOneQuery(t *testing.T) {
	ctx := context.Background()
	// The lookups wait behind the lock, so that they are all in flight at
	// once, however fast the machine.
	store, tx, secret, id := keyBehindLock(t)
	const callers = 20
	results := make(chan error, callers)
	for range callers {
		go func() { results <- lookUpAs(ctx, store, secret, id) }()
	}
	waitFor(t, func() bool { return lookupsWaiting(t, tx) > 0 })
	time.Sleep(300 * time.Millisecond) // time for more queries to queue, were they sent
	if n := lookupsWaiting(t, tx); n != 1 {
		t.Errorf("%d lookups of one key waiting in PostgreSQL, want 1 shared by the %d callers", n, callers)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range callers {
		if err := <-results; err != nil {
			t.Errorf("Lookup = %v", err)
		}
	}
}

// A caller that stops waiting (its client gone) fails alone: the lookup it
// started goes on for the others waiting on it.
func TestACallerGivingUpFailsNoOtherCaller(t *testing.T) {
	ctx := context.Background()
	store, tx, secret, id := keyBehindLock(t)
	first, giveUp := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() {
		_, err := store.Lookup(first, secret, nil)
		firstDone <- err
	}()
	waitFor(t, func() bool { return lookupsWaiting(t, tx) > 0 }) // the first caller's lookup is under way
	secondDone := make(chan error, 1)
	go func() { secondDone <- lookUpAs(ctx, store, secret, id) }()
	// The second caller has joined the first's lookup, held behind the lock.
	waitFor(t, func() bool { return store.lookupWaiters.Load() == 2 })
	giveUp()
	if err := <-firstDone; !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup by the caller that gave up = %v, want context.Canceled", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-secondDone; err != nil {
		t.Errorf("Lookup by the caller still waiting = %v, want the key", err)
	}
}

// A valid key whose entry has aged is looked up again even when mayFetch
// refuses (its client's address is over the failure budget because of
// another client behind it); an unknown one is not.
func TestLookupOfAKeyThatWasValidIsNotThrottled(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	secret, id := insertKey(t, pool, owner, []string{"export:read"})
	revoked, revokedID := insertKey(t, pool, owner, []string{"export:read"})
	unknown, _, _ := apikey.Generate([]string{"export:read"})
	store := New(pool, Options{TTL: time.Millisecond, UnheardTTL: time.Millisecond, MaxEntries: 100})
	ctx := context.Background()
	for _, s := range []string{secret, revoked, unknown} {
		store.Lookup(ctx, s, nil)
	}
	// Revoked while cached, and no listener here to hear it: only the
	// lookup that the aged entry brings about can find out.
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, revokedID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // every entry ages
	refuse := func() bool { return false }
	if got, err := store.Lookup(ctx, secret, refuse); err != nil || got.ID != id {
		t.Errorf("Lookup(aged valid key, mayFetch refusing) = %+v, %v, want key %s", got, err, id)
	}
	if _, err := store.Lookup(ctx, revoked, refuse); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Lookup(aged key revoked since, mayFetch refusing) = %v, want ErrUnauthenticated", err)
	}
	if _, err := store.Lookup(ctx, unknown, refuse); !errors.Is(err, ErrThrottled) {
		t.Errorf("Lookup(aged unknown key, mayFetch refusing) = %v, want ErrThrottled", err)
	}
}

func TestCacheIsBounded(t *testing.T) {
	pool := testenv.Postgres(t)
	store := New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 10})
	for i := 0; i < 50; i++ {
		k, _, _ := apikey.Generate([]string{"export:read"})
		store.Lookup(context.Background(), k, nil)
	}
	if n := store.size(); n > 10 {
		t.Fatalf("cache holds %d entries after 50 lookups, want at most 10", n)
	}
}

// size is how many entries the cache holds.
func (s *Store) size() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.recent.entries) + len(s.older.entries)
}

// storeUnknown caches n unknown keys' entries, as a flood of guessed keys
// does, numbered from first.
func storeUnknown(s *Store, first, n int, fetched time.Time) {
	for i := first; i < first+n; i++ {
		var h apikey.Hash
		binary.BigEndian.PutUint64(h[:], uint64(i))
		s.store(h, entry{fetched: fetched}, s.epoch.Load())
	}
}

// A key in use keeps its entry while a flood of guessed keys passes through
// the cache, and the cache stays within its bound: used once every tenth
// of the bound's new keys, here, and so at least once in each half of it. (Eviction dropped
// arbitrary entries, a busy key's as readily as the flood's: the key was
// looked up again, and, its entry gone, counted as a guess against its
// address's budget like any key never seen.)
func TestAKeyInUseKeepsItsEntryWhileNewKeysFlood(t *testing.T) {
	const bound = 100
	s := New(nil, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: bound})
	s.listening.Store(true)
	now := time.Now()
	busy := apikey.HashOf("busy")
	s.store(busy, entry{valid: true, key: Key{ID: "busy-id"}, fetched: now}, s.epoch.Load())
	const between = bound / 10 // guessed keys between two uses of the busy key
	for i := range 500 {
		storeUnknown(s, i*between, between, now)
		if n := s.size(); n > bound {
			t.Fatalf("the cache holds %d entries, over its bound of %d", n, bound)
		}
		if e, fresh := s.cached(busy, now); !fresh || !e.valid {
			t.Fatalf("after %d guessed keys the busy key's entry is gone", (i+1)*between)
		}
	}
	s.Forget("busy-id")
	if _, ok := s.cached(busy, now); ok {
		t.Error("the busy key's entry is still cached after Forget")
	}
}

// A flood of new keys through a full cache leaves it the memory it had once
// full. (Evicting a quarter of the map at each fill made Go's map grow:
// 100,000 entries took 18 MB once filled and 65-70 MB after a million more
// keys, 135 MB after ten million.)
func TestCacheMemoryStaysWithinItsBoundAsNewKeysFlood(t *testing.T) {
	const bound = 100_000
	s := New(nil, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: bound})
	now := time.Now()
	base := heapInUse()
	storeUnknown(s, 0, bound, now)
	full := heapInUse() - base
	storeUnknown(s, bound, 10*bound, now)
	after := heapInUse() - base
	runtime.KeepAlive(s)
	if after > full*3/2 {
		t.Errorf("the cache took %.1f MB once full and %.1f MB after %d new keys, want at most 1.5 times as much",
			float64(full)/(1<<20), float64(after)/(1<<20), 10*bound)
	}
}

// listen runs store's listener, logging to w, until the test ends.
func listen(t *testing.T, store *Store, w io.Writer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { store.Listen(ctx, slog.New(slog.NewTextHandler(w, nil))); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// revocationIsHeardOn runs a store's listener on pool, looks a new key up,
// revokes it in the database and waits until the store refuses it: the
// listener heard.
func revocationIsHeardOn(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	secret, id := insertKey(t, pool, newOwner(t, pool), []string{"export:read"})
	store := New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100})
	listen(t, store, io.Discard)
	waitFor(t, store.Listening)
	ctx := context.Background()
	if _, err := store.Lookup(ctx, secret, nil); err != nil {
		t.Fatalf("Lookup before revocation = %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := store.Lookup(ctx, secret, nil)
		return errors.Is(err, ErrUnauthenticated)
	})
}

// heapInUse is the size of the live heap, after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func TestRevocationIsHeard(t *testing.T) {
	revocationIsHeardOn(t, testenv.Postgres(t))
}

// Behind a pooler in transaction mode the LISTEN runs on whichever server
// connection is free, which then serves other clients: no revocation
// reaches the listener. Taken for listening, the gateway trusted a revoked
// key for KEY_CACHE_TTL; it must know that it does not hear, say so, and
// trust cached keys for UnheardTTL only.
func TestListenerBehindATransactionPoolerIsNotTakenForHearing(t *testing.T) {
	pooled := testenv.PgBouncer(t, testenv.PostgresURL(t), "transaction")
	// Without prepared statements, which such a pooler cannot keep.
	pool := testenv.Pool(t, pooled+" default_query_exec_mode=exec")
	store := New(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100})
	var logged testenv.Output // written by the listener's goroutine
	listen(t, store, &logged)
	waitFor(t, func() bool { return store.Listening() || strings.Contains(logged.String(), "cannot hear revocations") })
	if store.Listening() {
		t.Fatal("the listener behind a transaction pooler reports that it hears revocations")
	}
	if got := logged.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "transaction") {
		t.Errorf("log = %q, want an error naming the pooler's transaction mode", got)
	}
}

// Behind a pooler in session mode the listener's connection is a session
// of its own: revocations are heard.
func TestListenerBehindASessionPoolerHears(t *testing.T) {
	pooled := testenv.PgBouncer(t, testenv.PostgresURL(t), "session")
	revocationIsHeardOn(t, testenv.Pool(t, pooled))
}

func TestListenerReconnectsAndDropsTheCache(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	secret, _ := insertKey(t, pool, owner, []string{"export:read"})
	store, _, misses := counting(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100})
	var logged testenv.Output // written by the listener's goroutine
	listen(t, store, &logged)
	waitFor(t, store.Listening)
	ctx := context.Background()
	store.Lookup(ctx, secret, nil)
	// Kill the listener's backend, as a failover or network cut would.
	terminated := time.Now()
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !store.Listening() })
	// The server closed the connection: everything before was heard.
	if lost := store.lost(); lost.Before(terminated) {
		t.Errorf("the listener was recorded as last hearing at %v, before the server closed it (%v)", lost, terminated)
	}
	waitFor(t, store.Listening)
	before := misses.Load()
	store.Lookup(ctx, secret, nil)
	if misses.Load() != before+1 {
		t.Error("a key cached before the listener reconnected was still served from the cache")
	}
	// The log says when revocations are heard again, not only when they stop.
	if got := logged.String(); strings.Count(got, "revocation listener listening") != 2 ||
		!strings.Contains(got, "revocation listener disconnected") {
		t.Errorf("log = %q, want the disconnect and both times the listener listened", got)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A connection dropped right after LISTEN is retried with growing waits,
// like one that never got there; one that listened a while starts over.
func TestListenedSteadily(t *testing.T) {
	start := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		since, end time.Time
		want       bool
	}{
		{time.Time{}, start, false},
		{start, start.Add(time.Millisecond), false},
		{start, start.Add(steadyListen - time.Nanosecond), false},
		{start, start.Add(steadyListen), true},
		{start, start.Add(time.Hour), true},
	}
	for _, tt := range tests {
		if got := listenedSteadily(tt.since, tt.end); got != tt.want {
			t.Errorf("listenedSteadily(%v, %v) = %v, want %v", tt.since, tt.end, got, tt.want)
		}
	}
}

func TestNextBackoffStartsOverOnceListening(t *testing.T) {
	var waits []time.Duration
	last := time.Duration(0)
	for _, listened := range []bool{false, false, false, false, false, false, false, true, false} {
		last = nextBackoff(last, listened)
		waits = append(waits, last)
	}
	want := []time.Duration{firstBackoff, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, longestBackoff, firstBackoff, 200 * time.Millisecond}
	if !slices.Equal(waits, want) {
		t.Errorf("waits = %v, want %v", waits, want)
	}
}

// While the listener is away an entry is trusted for UnheardTTL from the
// later of its fetch and the disconnect (revocations up to the disconnect
// were heard), and never past TTL.
func TestFreshness(t *testing.T) {
	o := Options{TTL: 30 * time.Second, UnheardTTL: time.Second}
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	never := time.Unix(0, 0) // the listener never listened
	tests := []struct {
		name               string
		fetched, now, lost time.Time
		listening          bool
		want               bool
	}{
		{"listening, young", t0, t0.Add(29 * time.Second), never, true, true},
		{"listening, aged", t0, t0.Add(30 * time.Second), never, true, false},
		{"never listened, within UnheardTTL", t0, t0.Add(999 * time.Millisecond), never, false, true},
		{"never listened, past UnheardTTL", t0, t0.Add(time.Second), never, false, false},
		{"fetched 20 s before a disconnect, just after it", t0, t0.Add(20*time.Second + 10*time.Millisecond), t0.Add(20 * time.Second), false, true},
		{"fetched 20 s before a disconnect, UnheardTTL after it", t0, t0.Add(21 * time.Second), t0.Add(20 * time.Second), false, false},
		{"fetched after the disconnect", t0.Add(5 * time.Second), t0.Add(5*time.Second + 500*time.Millisecond), t0, false, true},
		{"fetched after the disconnect, past UnheardTTL", t0.Add(5 * time.Second), t0.Add(6 * time.Second), t0, false, false},
		{"disconnect after TTL ran out", t0, t0.Add(30 * time.Second), t0.Add(29*time.Second + 500*time.Millisecond), false, false},
	}
	for _, tt := range tests {
		if got := o.fresh(tt.fetched, tt.now, tt.listening, tt.lost); got != tt.want {
			t.Errorf("%s: fresh = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The moment the listener was last heard is kept on the monotonic clock:
// freshness compares it with the fetch and now without reading the wall
// clock, which may have stepped meanwhile (kept in Unix time, it had no
// monotonic reading, and a step back of an hour had cached keys trusted
// for KEY_CACHE_TTL after the listener was lost, not UnheardTTL).
func TestListenerLostAtIsOnTheMonotonicClock(t *testing.T) {
	store := New(nil, Options{TTL: 30 * time.Second, UnheardTTL: time.Second, MaxEntries: 1})
	heardAt := time.Now()
	store.heard(heardAt)
	store.lostAt.Store(store.heardAt.Load()) // as Listen does when the connection fails
	if lost := store.lost(); !lost.Equal(heardAt) || !strings.Contains(lost.String(), "m=") {
		t.Errorf("lost() = %v, want %v with a monotonic reading (m=)", lost, heardAt)
	}
}

// A revoked key stays cached past its TTL: revocation is final, and the
// workers a rotation left behind on the old key cost no lookups. An
// unknown key is looked up again once aged (it may have been created since).
func TestRevokedKeyStaysCached(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	revoked, revokedID := insertKey(t, pool, owner, []string{"export:read"})
	if _, err := pool.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, revokedID); err != nil {
		t.Fatal(err)
	}
	unknown, _, _ := apikey.Generate([]string{"export:read"})
	store, _, misses := counting(pool, Options{TTL: time.Millisecond, UnheardTTL: time.Millisecond, MaxEntries: 100})
	ctx := context.Background()
	store.Lookup(ctx, revoked, nil)
	store.Lookup(ctx, unknown, nil)
	time.Sleep(5 * time.Millisecond) // both entries age
	if _, err := store.Lookup(ctx, revoked, func() bool { t.Error("mayFetch asked for a revoked key"); return true }); !errors.Is(err, ErrRevokedKey) {
		t.Errorf("Lookup(aged revoked key) = %v, want ErrRevokedKey", err)
	}
	store.Lookup(ctx, unknown, nil)
	if got := misses.Load(); got != 3 {
		t.Errorf("misses = %d, want 3: the unknown key looked up again, the revoked one not", got)
	}
}

// Known names a key the cache holds, valid or revoked, without a lookup:
// no database query and no count; a key not cached, or cached as unknown,
// is not known.
func TestKnownNamesOnlyCachedKeys(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	valid, validID := insertKey(t, pool, owner, []string{"export:read"})
	revoked, revokedID := insertKey(t, pool, owner, []string{"export:read"})
	if _, err := pool.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, revokedID); err != nil {
		t.Fatal(err)
	}
	unknown, _, _ := apikey.Generate([]string{"export:read"})
	store, hits, misses := counting(pool, Options{TTL: time.Hour, UnheardTTL: time.Hour, MaxEntries: 100})
	for _, s := range []string{valid, revoked, unknown, "", "cxr_x"} {
		if key, ok := store.Known(s); ok {
			t.Errorf("Known(%.8s…) before any lookup = %+v, true; want not known", s, key)
		}
	}
	ctx := context.Background()
	for _, s := range []string{valid, revoked, unknown} {
		store.Lookup(ctx, s, nil)
	}
	hitsBefore, missesBefore := hits.Load(), misses.Load()
	for _, tt := range []struct {
		name, secret, wantID string
	}{
		{"valid", valid, validID}, {"revoked", revoked, revokedID}, {"unknown", unknown, ""}, {"empty", "", ""},
	} {
		key, ok := store.Known(tt.secret)
		if key.ID != tt.wantID || ok != (tt.wantID != "") || (ok && key.OwnerID != owner) {
			t.Errorf("Known(%s) = %+v, %v; want key id %q of owner %s", tt.name, key, ok, tt.wantID, owner)
		}
	}
	if hits.Load() != hitsBefore || misses.Load() != missesBefore {
		t.Errorf("Known counted lookups: hits %d → %d, misses %d → %d", hitsBefore, hits.Load(), missesBefore, misses.Load())
	}
}
