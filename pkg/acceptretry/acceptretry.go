// Package acceptretry keeps a listener accepting through a shortage of file
// descriptors or kernel memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), which
// passes once connections close: it waits and accepts again, as net/http's
// own server does, instead of handing the error to a server that stops on
// it. fasthttp (the gateway's Fiber) takes every accept error but a timeout
// for the listener's end: a gateway at its descriptor limit, under 50 more
// idle connections than it could hold, returned from Serve and exited,
// cutting off the requests it had accepted.
package acceptretry

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coinexport/export/pkg/logging"
)

// The wait after a failed accept doubles from minWait up to maxWait (net/http's
// steps): the first connection that closes frees a descriptor within
// milliseconds, and a shortage that lasts costs one attempt a second.
const (
	minWait = 5 * time.Millisecond
	maxWait = time.Second
)

// logInterval is how often at most a shortage is logged.
const logInterval = 10 * time.Second

// Listener is a net.Listener whose Accept waits out a shortage of
// descriptors or memory instead of returning it.
type Listener struct {
	net.Listener
	onRetry func(err error, wait time.Duration)

	closeOnce sync.Once
	closed    chan struct{}
}

// New wraps ln. onRetry is told of each failed accept and the wait before
// the next one; nil ignores them.
func New(ln net.Listener, onRetry func(err error, wait time.Duration)) *Listener {
	if onRetry == nil {
		onRetry = func(error, time.Duration) {}
	}
	return &Listener{Listener: ln, onRetry: onRetry, closed: make(chan struct{})}
}

// Accept returns the next connection, waiting while the process or the
// system is out of descriptors or memory. Any other error is returned, and
// so is net.ErrClosed at once when the listener is closed during a wait.
func (l *Listener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || !Shortage(err) {
			return c, err
		}
		wait = min(max(2*wait, minWait), maxWait)
		l.onRetry(err, wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-l.closed:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// Close closes the listener and ends a wait in Accept.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Shortage reports whether err is a shortage of descriptors (the
// process's or the system's) or of kernel memory: a condition that passes
// as connections close, not a fault of the listener (nor, for a dial, of
// the peer). Named Exhausted before, it read as "the retries are used up",
// which a listener here never is.
func Shortage(err error) bool {
	for _, errno := range shortages {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// shortages are the errors Shortage reports.
var shortages = [...]syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM}

// ShortageIn returns the shortage (as Shortage names one) whose text ends
// text, for an error kept as text alone: a net.DNSError keeps only the
// text of its socket's error ("dial udp …: socket: too many open files"),
// so errors.Is finds no errno in a lookup that failed for want of a
// descriptor.
func ShortageIn(text string) (syscall.Errno, bool) {
	for _, errno := range shortages {
		if strings.HasSuffix(text, errno.Error()) {
			return errno, true
		}
	}
	return 0, false
}

// LogRetries returns an onRetry for New that logs a WARN at most once per
// 10 s, counting the failed accepts it held back: at the limit an accept
// fails up to once a second per listener for as long as it lasts, and every
// connection that closes starts the waits over at 5 ms.
func LogRetries(log *slog.Logger) func(err error, wait time.Duration) {
	throttle := &logging.Throttle{Interval: logInterval}
	return func(err error, wait time.Duration) {
		if ok, skipped := throttle.Allow("accept"); ok {
			log.Warn("accept failed: out of file descriptors or memory; connections wait in the backlog",
				"error", err, "retry_in", wait.String(), "skipped_since_last", skipped)
		}
	}
}
