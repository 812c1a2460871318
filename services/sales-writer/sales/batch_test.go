package sales

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Each batch the writer sends is one implicit transaction, committed at
// its Sync: none of its statements begins, commits or ends a transaction.
// That is what lets a terminated session's FATAL read in a statement's
// place say that nothing of the call was done (postgres.Terminated,
// answered "nothing was applied"): PostgreSQL handles a termination after
// reading each message, so a batch with a COMMIT of its own can read the
// FATAL after that COMMIT (a batch BEGIN, INSERT, COMMIT terminated in its
// commit: the FATAL, and the row there).
func TestEveryBatchOfTheWriterCommitsAtItsSync(t *testing.T) {
	t.Parallel()
	req := Request{OwnerID: "o", PlatformID: "p", IdempotencyKey: "k", ItemID: "i", ExternalOrderID: "e"}
	scan := func(pgx.Row) error { return nil }
	call := func(stmt string) *groupedCall { return &groupedCall{req: req, stmt: stmt, scan: scan} }
	for name, batch := range map[string]*pgx.Batch{
		"a confirm alone":     keyLockBatch(req, confirmSQL, nil, scan),
		"a cancel alone":      keyLockBatch(req, cancelSQL, nil, scan),
		"a refusal's binding": keyLockBatch(req, bindRefusedSQL, nil, scan),
		"a group of one":      groupBatch([]*groupedCall{call(confirmSQL)}),
		"a group of two":      groupBatch([]*groupedCall{call(confirmSQL), call(cancelSQL)}),
	} {
		for _, q := range batch.QueuedQueries {
			if transactionControl(q.SQL) {
				t.Errorf("%s: the batch holds %q, a statement of transaction control: a FATAL of a terminated session may follow its commit", name, q.SQL)
			}
		}
	}
}

// transactionControl reports whether sql begins, commits or ends a
// transaction, or a part of one.
func transactionControl(sql string) bool {
	words := strings.Fields(strings.ToUpper(sql))
	if len(words) == 0 {
		return false
	}
	switch words[0] {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "PREPARE":
		return true
	}
	return false
}
