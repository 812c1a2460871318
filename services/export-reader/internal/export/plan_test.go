package export

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgtype"
)

// Every list statement is one range scan of a sync index, already in ORDER
// BY order and cut by the LIMIT (issue 4: "the hot path is one index range
// scan"), in the custom plan PostgreSQL makes for a statement's first runs
// and in the generic plan it may keep for the rest of a pooled connection's
// life (pgx prepares every statement): no Sort, no other scan, and every
// condition, the cursor's (updated_at, id) > (…) included, an Index Cond,
// never a Filter. With the cursor a Filter, each page would read the owner's
// items from the first one; every functional test would still pass, and only
// make bench would show a sync of a million items slowing page by page.
func TestListStatementsAreOneIndexRangeScan(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	owner := seededOwner(t, pool, 5000)
	seededOwner(t, pool, 5000) // another owner's items, which owner_id = $1 must skip
	if _, err := pool.Exec(ctx, "ANALYZE export_items"); err != nil {
		t.Fatal(err)
	}
	ownerID, err := catalog.ParseOwnerID(owner)
	if err != nil {
		t.Fatal(err)
	}
	var mid position
	if err := pool.QueryRow(ctx, `SELECT updated_at, id FROM export_items WHERE owner_id = $1
		ORDER BY updated_at, id OFFSET 2500 LIMIT 1`, owner).Scan(&mid.UpdatedAt, &mid.ID); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Exec(ctx, "RESET plan_cache_mode")

	statements := 0
	for _, lang := range catalog.Languages {
		for _, status := range []string{"", "active"} {
			for _, bound := range []string{"none", "updated_after", "cursor"} {
				q := Query{Lang: lang, Status: status, Limit: 100}
				var after *position
				switch bound {
				case "updated_after":
					q.UpdatedAfter = &mid.UpdatedAt
				case "cursor":
					after = &mid
				}
				sql, args := listStatement(q, ownerID, after, q.Limit+1)
				wantIndex := "export_items_sync_idx"
				if status != "" {
					wantIndex = "export_items_status_sync_idx"
				}
				for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
					name := fmt.Sprintf("%s status=%q bound=%s %s", lang, status, bound, mode)
					statements++
					if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
						t.Fatal(err)
					}
					prepared := fmt.Sprintf("list_%d", statements)
					if _, err := conn.Exec(ctx, "PREPARE "+prepared+" AS "+sql); err != nil {
						t.Fatalf("%s: PREPARE: %v", name, err)
					}
					var plan []struct{ Plan planNode }
					if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+prepared+"("+sqlLiterals(t, args)+")").Scan(&plan); err != nil {
						t.Fatalf("%s: EXPLAIN: %v", name, err)
					}
					checkOneIndexRangeScan(t, name, plan[0].Plan, wantIndex)
				}
			}
		}
	}
	if statements != 2*len(catalog.Languages)*2*3 {
		t.Errorf("checked %d plans, want every list statement's two", statements)
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan tree.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Filter    string     `json:"Filter"`
	Plans     []planNode `json:"Plans"`
}

// checkOneIndexRangeScan wants plan to be a Limit over one Index Scan of
// index whose every condition is an Index Cond.
func checkOneIndexRangeScan(t *testing.T, name string, plan planNode, index string) {
	t.Helper()
	shape, _ := json.Marshal(plan)
	if plan.NodeType != "Limit" || len(plan.Plans) != 1 {
		t.Errorf("%s: plan %s, want a Limit over one scan", name, shape)
		return
	}
	scan := plan.Plans[0]
	if scan.NodeType != "Index Scan" || scan.IndexName != index || len(scan.Plans) != 0 {
		t.Errorf("%s: plan %s, want a Limit over an Index Scan of %s", name, shape, index)
		return
	}
	if scan.Filter != "" || !strings.Contains(scan.IndexCond, "owner_id") {
		t.Errorf("%s: plan %s, want every condition an Index Cond, none a Filter", name, shape)
	}
}

// sqlLiterals writes args as the SQL literals of an EXECUTE's arguments.
func sqlLiterals(t *testing.T, args []any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case pgtype.UUID:
			out[i] = quote(fmt.Sprintf("%x-%x-%x-%x-%x", v.Bytes[0:4], v.Bytes[4:6], v.Bytes[6:8], v.Bytes[8:10], v.Bytes[10:16]))
		case string:
			out[i] = quote(v)
		case time.Time:
			out[i] = quote(v.UTC().Format(time.RFC3339Nano))
		case int:
			out[i] = fmt.Sprint(v)
		default:
			t.Fatalf("argument %d: %T has no literal here", i, a)
		}
	}
	return strings.Join(out, ", ")
}
