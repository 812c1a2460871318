package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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

// warnDroppedSettings logs a warning for each of own that a session of pool
// does not have: a pooler dropped it from the startup message. A failed
// check is not reported: it only informs.
func warnDroppedSettings(ctx context.Context, pool *pgxpool.Pool, own map[string]string, log *slog.Logger) {
	names := make([]string, 0, len(own))
	for name := range own {
		names = append(names, name)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, "SELECT name, setting FROM pg_settings WHERE name = ANY($1) ORDER BY name", names)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name, setting string
		if rows.Scan(&name, &setting) == nil && setting != own[name] {
			log.Warn("a session setting this binary asks for at connect is not in force: a pooler in front of PostgreSQL "+
				"dropped it (PgBouncer's ignore_startup_parameters); set it for the database or role (README, \"Behind PgBouncer\")",
				"setting", name, "asked", own[name], "in_force", setting)
		}
	}
}
