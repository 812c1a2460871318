package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/postgres"
)

// runIncremental is "loadgen incremental": it changes a fraction of the
// owner's items the way an owner's edit would (the status flips and
// updated_at moves), then syncs with updated_after set to a checkpoint taken
// just before the change, as spec 4.8 describes. The synced count must equal
// the changed count, so the figure also proves updated_after filters.
func runIncremental(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("incremental", flag.ContinueOnError)
	name := fs.String("name", "incremental", "scenario name in the results file")
	base := fs.String("base", "http://127.0.0.1:18080/v1", "base URL including /v1")
	auth := fs.String("auth", "key", "key or signed (see sync)")
	fraction := fs.Float64("fraction", 0.01, "share of the owner's items to change")
	limit := fs.Int("limit", 100, "page size")
	lang := fs.String("lang", "ENG", "content language")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *fraction <= 0 || *fraction > 1 {
		return errUsagef("--fraction must be in (0, 1]")
	}
	if err := cfg.need("DATABASE_URL", "LOADGEN_OWNER_ID"); err != nil {
		return err
	}
	// A bad --base or --auth fails here, before any item is changed.
	s, err := newSyncer(cfg, *auth, *base)
	if err != nil {
		return err
	}
	pool, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer postgres.Close(pool)
	checkpoint, changed, err := changeItems(ctx, pool, cfg.OwnerID, *fraction)
	if err != nil {
		return fmt.Errorf("%s: change items: %w", *name, err)
	}
	res, err := s.run(ctx, syncQuery{Limit: *limit, Lang: *lang, UpdatedAfter: checkpoint.Format(time.RFC3339Nano)})
	if err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	if res.Items != changed {
		return fmt.Errorf("%s: synced %d items after the checkpoint, want the %d changed", *name, res.Items, changed)
	}
	rec := syncRecord(*name, res)
	rec.Figures["changed"] = float64(changed)
	return appendRecord(cfg.Results, rec, stdout)
}

// changeItems flips the listed status of a random fraction of the owner's
// items and returns the database time just before the change, so no clock
// skew between the bench and PostgreSQL can hide or add a row.
func changeItems(ctx context.Context, pool *pgxpool.Pool, owner string, fraction float64) (time.Time, int, error) {
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM export_items WHERE owner_id = $1`, owner).Scan(&total); err != nil {
		return time.Time{}, 0, err
	}
	n := max(1, int(math.Round(float64(total)*fraction)))
	var checkpoint time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&checkpoint); err != nil {
		return time.Time{}, 0, err
	}
	// clock_timestamp() rather than now(): now() is the transaction's start,
	// which could equal the checkpoint on a fast machine.
	tag, err := pool.Exec(ctx, `
		UPDATE export_items SET listed_active = NOT listed_active, updated_at = clock_timestamp()
		WHERE owner_id = $1 AND id IN (
			SELECT id FROM export_items WHERE owner_id = $1 ORDER BY random() LIMIT $2)`, owner, n)
	if err != nil {
		return time.Time{}, 0, err
	}
	return checkpoint, int(tag.RowsAffected()), nil
}
