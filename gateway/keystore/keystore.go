// Package keystore resolves API keys to the identity they grant. Lookups go
// by the key's SHA-256 to PostgreSQL behind an in-memory cache holding both
// found and unknown keys for a short time; revocations arrive by LISTEN/NOTIFY
// and drop the key from the cache at once.
package keystore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/gateway/monotime"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"
)

// ErrUnauthenticated is what a missing, malformed, unknown or revoked key
// is: the client is answered alike for each, so it cannot tell them apart.
// Which one it was is told by the error (errors.Is with the four below),
// for the operator's log and trace only.
var ErrUnauthenticated = errors.New("keystore: unauthenticated")

// The causes of ErrUnauthenticated.
var (
	ErrMissingKey   = fmt.Errorf("%w: no key", ErrUnauthenticated)
	ErrMalformedKey = fmt.Errorf("%w: malformed key", ErrUnauthenticated)
	ErrUnknownKey   = fmt.Errorf("%w: unknown key", ErrUnauthenticated)
	// ErrRevokedKey comes with the revoked key (its id, owner and
	// platform), so that the refusal can name it.
	ErrRevokedKey = fmt.Errorf("%w: revoked key", ErrUnauthenticated)
)

// ErrThrottled is returned when a key is not known to be valid and mayFetch
// refused the database lookup (the caller is over its failed-authentication
// budget).
var ErrThrottled = errors.New("keystore: lookup throttled")

// Key is what a valid API key grants.
type Key struct {
	ID         string
	OwnerID    string
	PlatformID string
	Scopes     []string
}

// Options tune a Store.
type Options struct {
	// TTL is how long a lookup is cached while revocations are being heard.
	TTL time.Duration
	// UnheardTTL is how long a lookup is trusted once the revocation
	// listener is disconnected (from the last moment it was known to hear
	// revocations, or from the lookup if later: Options.fresh); it bounds
	// how late a revocation can apply.
	UnheardTTL time.Duration
	// MaxEntries bounds the cache.
	MaxEntries int
	// LookupTimeout, when above zero, bounds a lookup in the database,
	// waiting for a connection included: a PostgreSQL that stalls (a lock
	// queued behind a long migration, packets dropped) then gets the
	// request a prompt error instead of holding it for as long as the
	// client waits, and every later miss with it.
	LookupTimeout time.Duration
	// OnLookup is told whether each lookup was a cache hit. It must not block.
	OnLookup func(hit bool)
}

type entry struct {
	key     Key
	valid   bool
	fetched time.Time
}

// Store looks keys up.
type Store struct {
	pool *pgxpool.Pool
	opts Options

	// The cache is kept in two generations: recent holds the entries
	// stored or used since the last turn, older those of the turn before.
	// An entry of older that is used moves to recent; once recent holds
	// half of MaxEntries, older is dropped whole and recent becomes older
	// (a turn). So a key in use keeps its entry however many new keys a
	// flood brings, a turn costs no scan, and its new map frees what Go's
	// maps keep after deletes. Evicting a quarter of one map, expired
	// entries first and then arbitrary ones, instead held the lock for 28
	// ms on average and up to 139 ms each time (every request's lookup
	// waited), dropped busy keys' entries as readily as a flood's, and
	// grew the map for as long as new keys came: 100,000 unknown keys'
	// entries took 18 MB once filled, 65-70 MB after a million more keys and
	// 135 MB after ten million, past GOMEMLIMIT (golang/go#70886).
	mu            sync.RWMutex
	recent, older generation

	// lookups joins concurrent misses of one key into one query: when the
	// cache is emptied (the listener reconnected, after a PostgreSQL
	// restart) or a busy key's entry ages, every request of that key in
	// flight misses at once, and each used to queue its own query on the
	// gateway's few connections, at the moment the database is least able
	// to take them.
	lookups singleflight.Group
	// lookupWaiters counts the callers waiting on a lookup of lookups,
	// each counted once it has joined one (or started it): singleflight
	// shows none, and the tests wait on it to know a caller has joined
	// rather than sleep for it.
	lookupWaiters atomic.Int64

	// epoch changes whenever entries are dropped, so a lookup that raced a
	// revocation does not cache what it read before it.
	epoch     atomic.Uint64
	listening atomic.Bool
	// heardAt is the last moment the listener was known to hear
	// revocations (LISTEN, a notification, an answered ping, the server
	// closing the connection), and
	// lostAt its value when the listener was found lost (0 if it never
	// listened): every revocation made before lostAt was heard, so an
	// entry is current as of then, whenever it was fetched. A connection
	// that died silently is found lost up to idleCheck and a ping later,
	// and lostAt is still the moment it last answered. Both are
	// monotime.Instants: in Unix time, a wall clock stepped back while the
	// listener was away had cached keys trusted for KEY_CACHE_TTL instead
	// of UnheardTTL (a revocation applied that much later), and one
	// stepped forward had every cached key looked up again at once.
	heardAt, lostAt atomic.Int64
}

// New returns a Store over pool.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.OnLookup == nil {
		opts.OnLookup = func(bool) {}
	}
	return &Store{pool: pool, opts: opts, recent: newGeneration(), older: newGeneration()}
}

// generation is one generation of the cache (Store.recent, Store.older):
// entries by key hash, and the hashes of found keys by key id, for Forget.
type generation struct {
	entries map[apikey.Hash]entry
	byID    map[string]apikey.Hash
}

func newGeneration() generation {
	return generation{entries: make(map[apikey.Hash]entry), byID: make(map[string]apikey.Hash)}
}

func (g generation) put(h apikey.Hash, e entry) {
	g.entries[h] = e
	if e.key.ID != "" {
		g.byID[e.key.ID] = h
	}
}

func (g generation) remove(h apikey.Hash) {
	if e, ok := g.entries[h]; ok {
		delete(g.entries, h)
		delete(g.byID, e.key.ID)
	}
}

// generationSize is how many entries the recent generation takes before
// a turn: half the bound, so that both hold at most MaxEntries (2 for a
// bound of 1).
func (s *Store) generationSize() int { return max(s.opts.MaxEntries/2, 1) }

// Lookup returns the key for secret, or ErrUnauthenticated (one of its four
// causes; with the key, when revoked). On a cache miss
// it asks mayFetch (if not nil) before going to the database, and returns
// ErrThrottled if refused; not for a key whose aged entry says it was
// valid, which is looked up again in any case. Any other error means the key could not be
// checked (PostgreSQL unreachable).
//
// The cache is asked first: only well-formed keys are ever cached, so a hit
// is one (same SHA-256), and the form and checksum check, which costs more
// than the hash, is left to misses, where it still keeps junk away from the
// database and from the cache.
func (s *Store) Lookup(ctx context.Context, secret string, mayFetch func() bool) (Key, error) {
	hash := apikey.HashOf(secret)
	now := time.Now()
	last, fresh := s.cached(hash, now)
	if fresh {
		s.opts.OnLookup(true)
		return last.result()
	}
	if !apikey.WellFormed(secret) {
		if secret == "" {
			return Key{}, ErrMissingKey
		}
		return Key{}, ErrMalformedKey
	}
	s.opts.OnLookup(false)
	// A key that was valid when last looked up is checked again whatever
	// mayFetch says: that is no guess, and refusing it would lock a client
	// out, each time its entry ages, for the failures of another client
	// behind the same address (one NAT, one egress proxy). Such lookups are
	// bounded by the valid keys in use (one per key per TTL, times the
	// requests that miss the aged entry together), and the database still
	// decides: a key revoked meanwhile is refused.
	if !last.valid && mayFetch != nil && !mayFetch() {
		return Key{}, ErrThrottled
	}
	e, err := s.fetchShared(ctx, hash, now)
	if err != nil {
		return Key{}, err
	}
	return e.result()
}

// Known returns the key secret is, if the cache holds it as found in the
// database (valid or revoked), however old the entry: a hash names one key
// for good. It asks no database, checks no form and counts no lookup, so
// that a request refused before its key is authenticated (a body over the
// limit, which a client can send at will) can still name its sender to
// the operator at the cost of a hash. What it returns authenticates
// nothing.
func (s *Store) Known(secret string) (Key, bool) {
	if secret == "" {
		return Key{}, false
	}
	hash := apikey.HashOf(secret)
	s.mu.RLock()
	e, ok := s.recent.entries[hash]
	if !ok {
		e, ok = s.older.entries[hash]
	}
	s.mu.RUnlock()
	return e.key, ok && e.key.ID != ""
}

// fetchShared looks hash up in the database and caches the answer, or
// waits for the lookup of it already under way. The query runs detached
// from the caller that started it, within LookupTimeout: its client
// hanging up must not fail the others waiting on it; each caller still
// stops waiting when its own ctx ends.
func (s *Store) fetchShared(ctx context.Context, hash apikey.Hash, now time.Time) (entry, error) {
	results := s.lookups.DoChan(string(hash[:]), func() (any, error) {
		epoch := s.epoch.Load()
		e, err := s.fetch(context.WithoutCancel(ctx), hash)
		if err != nil {
			return entry{}, err
		}
		e.fetched = now
		s.store(hash, e, epoch)
		return e, nil
	})
	s.lookupWaiters.Add(1)
	defer s.lookupWaiters.Add(-1)
	select {
	case r := <-results:
		if r.Err != nil {
			return entry{}, r.Err
		}
		return r.Val.(entry), nil
	case <-ctx.Done():
		return entry{}, fmt.Errorf("keystore: lookup: %w", ctx.Err())
	}
}

// revoked reports an entry of a key found in the database, revoked.
func (e entry) revoked() bool { return !e.valid && e.key.ID != "" }

func (e entry) result() (Key, error) {
	switch {
	case e.valid:
		return e.key, nil
	case e.revoked():
		return e.key, ErrRevokedKey
	}
	return Key{}, ErrUnknownKey
}

// cached returns the key's entry, if any (the zero entry, not valid, if
// none), and whether it is still fresh.
func (s *Store) cached(hash apikey.Hash, now time.Time) (entry, bool) {
	s.mu.RLock()
	e, ok := s.recent.entries[hash]
	inOlder := false
	if !ok {
		e, ok = s.older.entries[hash]
		inOlder = ok
	}
	s.mu.RUnlock()
	if !ok {
		return entry{}, false
	}
	if inOlder {
		s.promote(hash)
	}
	if e.revoked() {
		// Revocation is final (no path clears revoked_at: exportctl keeps
		// the first revocation time), so a revoked key needs no second
		// look: workers a rotation left behind cost no lookups, however
		// many, for as long as the entry is not evicted.
		return e, true
	}
	return e, s.opts.fresh(e.fetched, now, s.listening.Load(), s.lost())
}

// lost is lostAt as a time with a monotonic reading, so that fresh
// compares it with the fetch and now on the monotonic clock.
func (s *Store) lost() time.Time { return monotime.Instant(s.lostAt.Load()).Time() }

// fresh reports whether an entry fetched at fetched may be trusted at now:
// for TTL while the listener hears revocations, and while it does not, for
// UnheardTTL more from the later of the fetch and the moment it stopped
// hearing them (lost), as of which the entry was current. A listener that
// drops for a moment (a PostgreSQL restart) then costs no valid key a
// refusal, and a revocation made while it is away still applies within
// UnheardTTL.
func (o Options) fresh(fetched, now time.Time, listening bool, lost time.Time) bool {
	if now.Sub(fetched) >= o.TTL {
		return false
	}
	if listening {
		return true
	}
	return now.Before(later(fetched, lost).Add(o.UnheardTTL))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

const lookupSQL = `SELECT id, owner_id, platform_id, scopes, revoked_at FROM api_keys WHERE hash = $1`

func (s *Store) fetch(ctx context.Context, hash apikey.Hash) (entry, error) {
	var (
		id, owner string
		platform  *string
		scopes    []string
		revoked   *time.Time
	)
	if s.opts.LookupTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.LookupTimeout)
		defer cancel()
	}
	// Through postgres.AcquireFunc: with PostgreSQL out of connection
	// slots, a lookup that finds the pool's connections busy waits for one
	// of them, within LookupTimeout, where the pool's own query failed at
	// once asking for one more, and the request was answered 503.
	err := postgres.AcquireFunc(ctx, s.pool, func(conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, lookupSQL, hash[:]).Scan(&id, &owner, &platform, &scopes, &revoked)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, fmt.Errorf("keystore: lookup: %w", err)
	}
	e := entry{valid: revoked == nil, key: Key{ID: id, OwnerID: owner, Scopes: scopes}}
	if platform != nil {
		e.key.PlatformID = *platform
	}
	return e, nil
}

func (s *Store) store(hash apikey.Hash, e entry, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch.Load() != epoch {
		return
	}
	s.older.remove(hash)
	s.putRecent(hash, e)
}

// promote moves hash's entry from the older generation to the recent one:
// it is in use. Another request may have moved it, or a revocation dropped
// it, since it was read.
func (s *Store) promote(hash apikey.Hash) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.older.entries[hash]; ok {
		s.older.remove(hash)
		s.putRecent(hash, e)
	}
}

// putRecent stores hash's entry in the recent generation, turning the
// generations first if it is full. Called with mu held.
func (s *Store) putRecent(hash apikey.Hash, e entry) {
	if _, held := s.recent.entries[hash]; !held && len(s.recent.entries) >= s.generationSize() {
		s.older, s.recent = s.recent, newGeneration()
	}
	s.recent.put(hash, e)
}

// Entries is how many entries the cache holds, both generations: at most
// MaxEntries (2 for a bound of 1). Read at each scrape, for the gauge.
func (s *Store) Entries() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.recent.entries) + len(s.older.entries)
}

// Forget drops the key with id from the cache (a revocation).
func (s *Store) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch.Add(1)
	for _, g := range []generation{s.recent, s.older} {
		if h, ok := g.byID[id]; ok {
			g.remove(h)
		}
	}
}

// ForgetAll empties the cache (the listener reconnected and may have missed
// revocations).
func (s *Store) ForgetAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch.Add(1)
	s.recent, s.older = newGeneration(), newGeneration()
}

// Listening reports whether revocations are being heard.
func (s *Store) Listening() bool { return s.listening.Load() }
