package keystore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/coinexport/export/gateway/monotime"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RevocationChannel is the channel the api_keys trigger notifies, with the
// key id as payload.
const RevocationChannel = "api_key_revoked"

// Listen hears revocations until ctx ends, on a connection taken out of the
// pool for good so its LISTEN never leaks to other queries. Whenever it
// (re)connects it empties the cache, since anything sent while it was away
// is lost; while it is away, cached keys are trusted for UnheardTTL more
// (Options.fresh).
func (s *Store) Listen(ctx context.Context, log *slog.Logger) {
	var backoff time.Duration
	for ctx.Err() == nil {
		since, err := s.listenOnce(ctx, func() {
			// The pair of the disconnect's warning: revocations apply at
			// once again, and cached keys are looked up anew.
			log.InfoContext(ctx, "revocation listener listening; key cache emptied")
		})
		if s.listening.Load() { // only this goroutine changes it
			s.lostAt.Store(s.heardAt.Load()) // before listening reads false
			s.listening.Store(false)
		}
		backoff = nextBackoff(backoff, listenedSteadily(since, time.Now()))
		if ctx.Err() != nil {
			return
		}
		wait := backoff
		if errors.Is(err, ErrNotHeard) {
			// Not a fault that passes: the pooler's mode stays as it is
			// until an operator changes it, so the attempts are spaced out
			// and each is an error, not a warning.
			wait = notHeardRetry
			log.ErrorContext(ctx, "revocation listener cannot hear revocations; retrying", "error", err, "retry_in", wait.String())
		} else {
			log.WarnContext(ctx, "revocation listener disconnected; retrying", "error", err, "retry_in", wait.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Reconnection waits: doubling from the first to the longest while the
// attempts fail. An attempt counts as a success once it has listened for
// steadyListen: a connection that a server or proxy drops right after
// LISTEN would otherwise be retried every 100 ms for ever.
const (
	firstBackoff   = 100 * time.Millisecond
	longestBackoff = 5 * time.Second
	steadyListen   = 10 * time.Second
	// notHeardRetry spaces the attempts of a listener whose connection
	// cannot hear notifications (ErrNotHeard).
	notHeardRetry = time.Minute
)

// nextBackoff is the wait before the next attempt, after one that waited
// last and did or did not listen steadily. One that did starts the
// doubling over: otherwise a gateway that lost the connection a few times
// in its life would wait the longest after every later drop, with each
// cache miss going to the database meanwhile.
func nextBackoff(last time.Duration, steady bool) time.Duration {
	if steady || last == 0 {
		return firstBackoff
	}
	return min(last*2, longestBackoff)
}

// listenedSteadily reports whether an attempt that started to listen at
// since (zero if it never did) and ended at end listened for steadyListen.
func listenedSteadily(since, end time.Time) bool {
	return !since.IsZero() && end.Sub(since) >= steadyListen
}

// listenOnce listens on one connection until it fails, and returns when
// it started to listen (zero if it never did). onListen is called once it
// listens.
func (s *Store) listenOnce(ctx context.Context, onListen func()) (since time.Time, _ error) {
	// The pool's own Acquire, not postgres.Acquire: refused a new
	// connection for want of a slot, the listener would wait for one of
	// the lookups' busy ones and take it out of the pool for good, leaving
	// the lookups one fewer, or none. Refused, it tries again after its
	// back-off, and cached keys are trusted for UnheardTTL meanwhile. A
	// lookups' connection idle at that moment it still takes (Hijack), as
	// it always has: with no slot left, the pool then stays one short
	// until a slot frees.
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return since, err
	}
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	probe := probeChannel()
	if _, err := conn.Exec(ctx, "LISTEN "+RevocationChannel+"; LISTEN "+probe); err != nil {
		return since, err
	}
	if err := s.hearProbe(ctx, conn, probe); err != nil {
		return since, err
	}
	s.ForgetAll()
	onListen()
	since = time.Now()
	s.heard(since)
	s.listening.Store(true)
	for {
		// A connection that died without a TCP reset would wait forever, so
		// wake up now and then and make sure the server still answers.
		wctx, cancel := context.WithTimeout(ctx, idleCheck)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			s.Forget(n.Payload)
			s.heard(time.Now())
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				s.heardUntilClosed(err)
				return since, err
			}
			s.heard(time.Now()) // notifications sent before it came first
		default:
			s.heardUntilClosed(err)
			return since, err
		}
	}
}

// idleCheck is how long the listener waits in silence before it pings.
const idleCheck = 20 * time.Second

// ErrNotHeard is the listener's error when a notification sent through the
// pool does not reach its LISTEN: the connection leads to PostgreSQL
// through a pooler in transaction mode (PgBouncer pool_mode=transaction),
// which runs the LISTEN on whichever server connection is free and then
// hands that connection to other clients, and drops a server connection
// that gets a notification while no client holds it. Taken for listening
// there, the gateway trusted cached keys for KEY_CACHE_TTL (30 s) after
// their revocation, where the README promises a second.
var ErrNotHeard = errors.New("keystore: a notification sent to the listener's channel was not heard: " +
	"its connection is not a session of its own (a pooler in transaction mode, such as PgBouncer's pool_mode=transaction); " +
	"revocations cannot be pushed, so cached keys are trusted for KEY_CACHE_UNHEARD_TTL only (README, \"Behind PgBouncer\")")

// probeWait bounds the sending of the listener's own probe and the wait
// for it: on a session it arrives within a round trip.
const probeWait = 5 * time.Second

// probeChannel is a channel of this connection's alone, so that its probe
// reaches no other gateway.
func probeChannel() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "api_key_listener_probe_" + hex.EncodeToString(b)
}

// hearProbe sends a notification to probe through the pool, from another
// connection, and waits for it on conn, which LISTENs to it: only a
// connection that is a session of its own hears it. Revocations heard
// meanwhile are applied.
func (s *Store) hearProbe(ctx context.Context, conn *pgx.Conn, probe string) error {
	wctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	// Through postgres.AcquireFunc, as the lookups: with PostgreSQL out of
	// connection slots the probe waits for one of the pool's connections.
	if err := postgres.AcquireFunc(wctx, s.pool, func(conn *pgxpool.Conn) error {
		_, err := conn.Exec(wctx, "SELECT pg_notify($1, '')", probe)
		return err
	}); err != nil {
		return err // not sent: not ErrNotHeard, even past probeWait
	}
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case err == nil && n.Channel == probe:
			return nil
		case err == nil:
			s.Forget(n.Payload)
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			return ErrNotHeard
		default:
			return err
		}
	}
}

// heard records that the listener was hearing revocations at t: every one
// made before t has been applied.
func (s *Store) heard(t time.Time) { s.heardAt.Store(int64(monotime.Of(t))) }

// heardUntilClosed records, for a connection that failed with err, that it
// was hearing until now if the server closed it (a restart, a terminated
// backend): the close came after everything sent before it. A connection
// that went silent (a ping that timed out) was last heard when it last
// answered.
func (s *Store) heardUntilClosed(err error) {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return
	}
	s.heard(time.Now())
}
