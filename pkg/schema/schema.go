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
	files, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("schema: locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
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
