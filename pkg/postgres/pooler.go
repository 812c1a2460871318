package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A pooler in front of PostgreSQL (PgBouncer) passes on a few session
// settings of the connection's startup message (application_name among
// them) and refuses any other: PgBouncer closes the connection with
// "unsupported startup parameter: jit" (08P01), unless the setting is in
// its ignore_startup_parameters, when it drops it without a word. Open's
// own settings (PoolerIgnoredSettings) travel there.
// Refused, a binary stopped at start with PgBouncer's message alone;
// dropped, sales-writer ran without its statement_timeout, and no log said
// so. Both now say what was meant and what to set (README, "Behind
// PgBouncer").

// PoolerIgnoredSettings is the value of PgBouncer's
// ignore_startup_parameters that every binary needs: the settings Open
// and its Options give in the startup message, but application_name,
// which PgBouncer passes on. One list for the error, the README and the
// tests: the error once named three, while sales-writer also sent
// default_transaction_isolation (ReadCommitted), so a writer set up as
// it said was refused again, for the fourth.
const PoolerIgnoredSettings = "jit,enable_seqscan,statement_timeout,default_transaction_isolation"

// ErrSettingRefused wraps a connection refused for a setting of its
// startup message.
var ErrSettingRefused = errors.New("postgres: a setting this binary gives its sessions at connect was refused, " +
	"as PgBouncer refuses any it does not pass on: set PgBouncer's ignore_startup_parameters = " + PoolerIgnoredSettings +
	" and set them for the database or role instead (README, \"Behind PgBouncer\")")

// settingRefused is err wrapped in ErrSettingRefused when the server (a
// pooler) refused a startup parameter.
func settingRefused(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.HasPrefix(pgErr.Message, "unsupported startup parameter") {
		return fmt.Errorf("%w: %w", ErrSettingRefused, err)
	}
	return err
}

// ownSettings are the session settings the binary asks for itself (Open's
// and opts', not those the DSN or a PG* variable gives, whose value is
// written as the operator wrote it) with their values as PostgreSQL's
// pg_settings shows them.
func ownSettings(dsn string, opts []Option) map[string]string {
	own := map[string]string{"jit": "off"}
	for _, opt := range opts {
		opt(own)
	}
	if cfg, err := parseConfig(dsn); err == nil {
		for name := range cfg.ConnConfig.RuntimeParams {
			delete(own, name)
		}
	}
	return own
}

// settingsWatch checks each new session of a pool for the settings the
// binary asked for at connect (own), and warns of each one a pooler
// dropped. Checked on every session, not once at start: behind PgBouncer
// in session mode a server connection's next client gets it after
// DISCARD ALL, whose RESET ALL undoes connect_query's settings, so a
// binary started well could later run on sessions without its
// statement_timeout and no log said so (README, "Behind PgBouncer").
// A setting is warned of once while it stays dropped, and again should it
// be dropped after a session had it.
type settingsWatch struct {
	own   map[string]string
	query string
	log   *slog.Logger

	mu      sync.Mutex
	dropped map[string]bool // warned of, and not seen in force since
}

func newSettingsWatch(own map[string]string, log *slog.Logger) *settingsWatch {
	names := make([]string, 0, len(own))
	for name := range own {
		names = append(names, "'"+name+"'") // the binary's own setting names: letters and '_'
	}
	slices.Sort(names)
	return &settingsWatch{own: own, log: log, dropped: map[string]bool{},
		// The simple protocol: it runs as AfterConnect, before pgx's
		// statement cache, and through a pooler in any mode.
		query: "SELECT name, setting FROM pg_settings WHERE name IN (" + strings.Join(names, ", ") + ") ORDER BY name"}
}

// check reads conn's settings and warns of each dropped one. A failed
// check is not reported, nor does it fail the connection: it only informs.
func (w *settingsWatch) check(ctx context.Context, conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	results, err := conn.Exec(ctx, w.query).ReadAll()
	if err != nil || len(results) != 1 || results[0].Err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, row := range results[0].Rows {
		name, setting := string(row[0]), string(row[1])
		if setting == w.own[name] {
			delete(w.dropped, name)
			continue
		}
		if !w.dropped[name] {
			w.dropped[name] = true
			w.log.Warn("a session setting this binary asks for at connect is not in force: a pooler in front of PostgreSQL "+
				"dropped it (PgBouncer's ignore_startup_parameters, or session mode's DISCARD ALL after connect_query); "+
				"set it for the role (README, \"Behind PgBouncer\")",
				"setting", name, "asked", w.own[name], "in_force", setting)
		}
	}
}

// watchSettings has every new session of cfg checked by w, after the
// AfterConnect cfg had.
func watchSettings(cfg *pgconn.Config, w *settingsWatch) {
	connected := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		if connected != nil {
			if err := connected(ctx, conn); err != nil {
				return err
			}
		}
		w.check(ctx, conn)
		return nil
	}
}
