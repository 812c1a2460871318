package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/postgres"
)

// runIDs is "loadgen ids": it writes random item ids of the owner, path
// escaped, one per line, for the GET-by-id scenarios.
func runIDs(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ids", flag.ContinueOnError)
	count := fs.Int("count", 10000, "how many ids")
	out := fs.String("out", "ids.txt", "file to write")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := cfg.need("DATABASE_URL", "LOADGEN_OWNER_ID"); err != nil {
		return err
	}
	pool, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer postgres.Close(pool)
	ids, err := sampleIDs(ctx, pool, cfg.OwnerID, *count, false)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("owner has no items")
	}
	if err := writeLines(*out, ids, url.PathEscape); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "wrote %d ids to %s\n", len(ids), *out)
	return err
}

// sampleIDs returns up to n random item ids of owner; activeOnly keeps the
// ones a sale can be confirmed on.
func sampleIDs(ctx context.Context, pool *pgxpool.Pool, owner string, n int, activeOnly bool) ([]string, error) {
	q := `SELECT id FROM export_items WHERE owner_id = $1 ORDER BY random() LIMIT $2`
	if activeOnly {
		q = `SELECT id FROM export_items WHERE owner_id = $1 AND status = 'active' ORDER BY random() LIMIT $2`
	}
	rows, err := pool.Query(ctx, q, owner, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func writeLines(path string, lines []string, encode func(string) string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, l := range lines {
		w.WriteString(encode(l))
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
