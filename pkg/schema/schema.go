// Package schema owns the PostgreSQL schema shared by every service: the SQL
// migrations embedded in the binary and the function that applies them.
package schema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate applies every pending migration. A PostgreSQL advisory lock makes it
// safe to run from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("schema: locker: %w", err)
	}
	provider, cleanup, err := newProvider(pool, goose.WithSessionLocker(locker))
	if err != nil {
		return err
	}
	defer cleanup()
	results, err := provider.Up(ctx)
	if err != nil {
		return fmt.Errorf("schema: migrate up: %w", err)
	}
	for _, r := range results {
		if log != nil {
			log.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
		}
	}
	return nil
}

// newProvider returns a goose provider of the embedded migrations on pool,
// and the function that releases it.
func newProvider(pool *pgxpool.Pool, opts ...goose.ProviderOption) (*goose.Provider, func(), error) {
	files, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, nil, fmt.Errorf("schema: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files, opts...)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("schema: %w", err)
	}
	return provider, func() { db.Close() }, nil
}

// Version identifies the set of migrations (a hash of their contents), so
// tests can cache a migrated template database per schema version.
func Version() string {
	h := sha256.New()
	entries, _ := migrations.ReadDir("migrations")
	for _, e := range entries {
		b, _ := migrations.ReadFile("migrations/" + e.Name())
		h.Write([]byte(e.Name()))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// Check returns nil when the database holds every migration this build
// embeds, and otherwise an error naming the version it is at and the one
// the build needs. It reads only, and takes no lock, so it can run on a
// replica and as often as a readiness probe asks.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	provider, cleanup, err := newProvider(pool)
	if err != nil {
		return err
	}
	defer cleanup()
	pending, err := provider.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("schema: reading the applied migrations (run exportctl migrate): %w", err)
	}
	if !pending {
		return nil
	}
	at, err := provider.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("schema: reading the database's version: %w", err)
	}
	sources := provider.ListSources()
	return fmt.Errorf("schema: the database is at version %d, this build needs %d: run exportctl migrate",
		at, sources[len(sources)-1].Version)
}

// Readiness is a service's readiness check: PostgreSQL answers and its
// schema is the one the build was written for. A service built for a newer
// schema stays unready (the gateway and Kubernetes send it nothing) until
// exportctl migrate has run, rather than failing on a column that is not
// there yet; this is what makes a rollout wait for its migration Job.
// Migrations only go up in production, so once current it only pings.
type Readiness struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	current atomic.Bool
}

// NewReadiness returns the check for pool, logging when the schema becomes
// current.
func NewReadiness(pool *pgxpool.Pool, log *slog.Logger) *Readiness {
	return &Readiness{pool: pool, log: log}
}

// Ready is the check, for httpserver.Config.Ready.
func (r *Readiness) Ready(ctx context.Context) error {
	if err := r.pool.Ping(ctx); err != nil {
		return err
	}
	if r.current.Load() {
		return nil
	}
	if err := Check(ctx, r.pool); err != nil {
		return err
	}
	if r.current.CompareAndSwap(false, true) {
		r.log.Info("database schema is current", "schema_version", Version())
	}
	return nil
}
