package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/postgres"
)

// docColumn maps a lang to the column holding its pre-rendered JSON.
var docColumn = map[string]string{"ENG": "doc_eng", "RUS": "doc_rus", "UKR": "doc_ukr"}

// runScan is "loadgen scan": the sync baseline. It reads the same rows the
// reader serves, with the reader's keyset query and page size, straight
// from PostgreSQL over one connection, keeping the stored JSON as bytes: the
// floor no HTTP service over this table can beat.
func runScan(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("scan", flag.ContinueOnError)
	name := fs.String("name", "scan", "scenario name in the results file")
	limit := fs.Int("limit", 100, "page size")
	lang := fs.String("lang", "ENG", "content language")
	expect := fs.Int("expect", 0, "expected item count (0: no check)")
	repeat := fs.Int("repeat", 1, "timed scans; the fastest is recorded")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	col, ok := docColumn[*lang]
	if !ok {
		return errUsagef("--lang must be ENG, RUS or UKR")
	}
	if err := cfg.need("DATABASE_URL", "LOADGEN_OWNER_ID"); err != nil {
		return err
	}
	pool, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer postgres.Close(pool)
	res, err := fastest(*repeat, func() (syncResult, error) {
		res, err := keysetScan(ctx, pool, cfg.OwnerID, col, *limit)
		if err == nil && *expect > 0 && res.Items != *expect {
			err = fmt.Errorf("scanned %d items, want %d", res.Items, *expect)
		}
		return res, err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	return appendRecord(cfg.Results, syncRecord(*name, res), stdout)
}

// keysetScan pages through an owner's items ordered by (updated_at, id).
func keysetScan(ctx context.Context, pool *pgxpool.Pool, owner, col string, limit int) (syncResult, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return syncResult{}, err
	}
	defer conn.Release()
	first := `SELECT id, status, updated_at, ` + col + ` FROM export_items
		WHERE owner_id = $1 ORDER BY updated_at, id LIMIT $2`
	next := `SELECT id, status, updated_at, ` + col + ` FROM export_items
		WHERE owner_id = $1 AND (updated_at, id) > ($3, $4) ORDER BY updated_at, id LIMIT $2`
	var (
		res    syncResult
		lastAt time.Time
		lastID string
		doc    []byte
		status string
	)
	start := time.Now()
	for {
		t0 := time.Now()
		var rows pgx.Rows
		if res.Pages == 0 {
			rows, err = conn.Query(ctx, first, owner, limit)
		} else {
			rows, err = conn.Query(ctx, next, owner, limit, lastAt, lastID)
		}
		if err != nil {
			return res, err
		}
		n := 0
		for rows.Next() {
			if err := rows.Scan(&lastID, &status, &lastAt, &doc); err != nil {
				rows.Close()
				return res, err
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return res, err
		}
		res.PageLatency.Add(time.Since(t0))
		res.Pages++
		res.Items += n
		if n < limit {
			break
		}
	}
	res.Took = time.Since(start)
	return res, nil
}
