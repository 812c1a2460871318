// Package stopsignal gives every binary of the project the same answer to
// SIGINT and SIGTERM: the first one starts the graceful stop, a second one
// ends the process at once.
package stopsignal

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// signals stop a binary: SIGINT is Ctrl-C, SIGTERM what Compose,
// Kubernetes, systemd and make run send.
var signals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// Context returns a context that is done at the first SIGINT or SIGTERM:
// main then drains and flushes its spans. Before it is done, both signals
// are given back their default effect, so a second one ends the process at
// once, killed by that signal, as an operator pressing Ctrl-C twice or a
// supervisor sending TERM again expects (nginx and most Go servers do so).
// Held until main returned (signal.NotifyContext with its stop deferred),
// the handler swallowed that second signal and the process waited out its
// whole drain, up to 30 s. (A process started with SIGINT ignored, as a
// shell script's background job is, ignores a second SIGINT again: that is
// its default.)
//
// stop releases the signals early and ends the context; main defers it.
func Context() (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	received := make(chan os.Signal, 1)
	signal.Notify(received, signals...)
	go func() {
		select {
		case <-received:
		case <-ctx.Done():
		}
		// Reset, not Stop: it restores the default even if a library
		// registered for these signals too. Done before ctx is: once the
		// drain has started, a second signal cannot be swallowed.
		signal.Reset(signals...)
		cancel()
	}()
	return ctx, cancel
}
