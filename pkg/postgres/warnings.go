package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// Warnings records whether PostgreSQL sent a connection a WARNING: a
// notice, not an error, that says a statement did less than it was asked
// while it succeeded. The one that matters here comes from a cancel
// request that reaches a COMMIT waiting for a synchronous standby: the
// wait ends with a WARNING, the transaction committed locally only
// (PostgreSQL's syncrep.c). pgx drops notices unless told otherwise, so
// without this a caller could not tell that COMMIT from one that
// succeeded plainly.
//
// The connection's notice handler sets it while it reads the server's
// answers, in the goroutine that holds the connection: Reset and Heard
// need no lock as long as that goroutine calls them, between statements.
type Warnings struct {
	heard bool
	first Warning // the first since the last Reset, when heard
}

// Warning is what PostgreSQL said of a warning, for a log line or a span:
// its Code (SQLSTATE) and unlocalized Severity can be matched on; its
// Message is translated by lc_messages, to be shown, never matched. A
// syncrep.c WARNING (a commit's wait for a synchronous standby cut) is
// 01000 when a cancel cut it, 57P01 when the backend was terminated.
type Warning struct {
	Code     string
	Severity string // "" from a server before 9.6, or a pooler
	Message  string
}

// warningsKey is where a connection keeps its Warnings in pgconn's
// CustomData.
const warningsKey = "github.com/coinexport/export/pkg/postgres.Warnings"

// WarningsOf returns the Warnings of conn, or nil for a connection of a
// pool this package did not open (pgxpool.New), whose warnings nobody
// records: its caller cannot tell that none came.
func WarningsOf(conn *pgconn.PgConn) *Warnings {
	w, _ := conn.CustomData()[warningsKey].(*Warnings)
	return w
}

// Reset forgets what was heard, before the statements whose warnings
// matter: a warning of an earlier statement on the connection, another
// caller's, is not theirs.
func (w *Warnings) Reset() { w.heard, w.first = false, Warning{} }

// Heard reports whether a WARNING came since the last Reset.
func (w *Warnings) Heard() bool { return w.heard }

// First is the first WARNING since the last Reset; the zero Warning when
// none came. The strings are the notice's own: recording them allocates
// nothing, and a connection that hears no notice pays nothing.
func (w *Warnings) First() Warning { return w.first }

// recordWarnings gives each connection of cfg its Warnings, and has its
// notice handler set them, calling the handlers cfg had.
func recordWarnings(cfg *pgconn.Config) {
	connected := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		conn.CustomData()[warningsKey] = &Warnings{}
		if connected != nil {
			return connected(ctx, conn)
		}
		return nil
	}
	noticed := cfg.OnNotice
	cfg.OnNotice = func(conn *pgconn.PgConn, n *pgconn.Notice) {
		if w := WarningsOf(conn); w != nil && isWarning(n) {
			w.hear(n)
		}
		if noticed != nil {
			noticed(conn, n)
		}
	}
}

// hear records the warning n.
func (w *Warnings) hear(n *pgconn.Notice) {
	if !w.heard {
		w.first = Warning{Code: n.Code, Severity: n.SeverityUnlocalized, Message: n.Message}
	}
	w.heard = true
}

// isWarning reports whether n is a WARNING, read from its unlocalized
// severity (lc_messages translates the other, and the message). A notice
// without one (a server before 9.6, a pooler's own) cannot say it is not a
// warning, and is taken for one: only a warning's absence is relied on.
func isWarning(n *pgconn.Notice) bool {
	return n.SeverityUnlocalized == "WARNING" || n.SeverityUnlocalized == ""
}

// WarnedError is an error that ended a transaction after PostgreSQL had
// warned on its connection without an ERROR: above all a connection lost
// after the WARNING of a session terminated while its COMMIT waited for a
// synchronous standby (57P01: the transaction committed locally, and the
// session then ends without another word, syncrep.c), or a deadline met
// in that wait. The transaction may have committed. Its text names the
// warning, and Cause reads the warning's SQLSTATE where no server error
// says more: before, such a line said only "unexpected EOF".
type WarnedError struct {
	Warning Warning
	Err     error
}

func (e *WarnedError) Error() string {
	return e.Err.Error() + " (after PostgreSQL's " + e.Warning.Severity + " " + e.Warning.Code + ": " + e.Warning.Message + ")"
}

func (e *WarnedError) Unwrap() error { return e.Err }
