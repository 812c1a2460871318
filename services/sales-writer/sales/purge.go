package sales

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coinexport/export/pkg/postgres"
)

// purgeBatch bounds the records one purge statement deletes.
const purgeBatch = 5000

// Purge deletes every expired idempotency record and refusal, in short
// transactions, and returns how many it deleted. Expired ones are already
// ignored by Execute; purging only keeps the tables small.
func (w *Writer) Purge(ctx context.Context) (int64, error) {
	var total int64
	for _, purge := range []string{purgeSQL, purgeRefusalsSQL} {
		for {
			tag, err := w.db.Exec(ctx, purge, purgeBatch)
			if err != nil {
				return total, fmt.Errorf("sales: purge: %w", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < purgeBatch {
				break
			}
		}
	}
	return total, nil
}

// RunPurge purges expired records every interval until ctx is done. Several
// instances may purge at once; they only share the work.
func (w *Writer) RunPurge(ctx context.Context, interval time.Duration, log *slog.Logger) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			n, err := w.Purge(ctx)
			if err != nil && ctx.Err() == nil {
				// PostgreSQL's refusals (its wraparound guard, a full disk,
				// read-only) say what to do, as a sale's line does.
				log.WarnContext(ctx, "idempotency purge failed", "error", err, postgres.CauseAttr(err))
				continue
			}
			if n > 0 {
				log.InfoContext(ctx, "idempotency records and refusals purged", "count", n)
			}
		}
	}
}
