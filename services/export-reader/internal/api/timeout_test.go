package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

// A read the database holds past EXPORT_READER_QUERY_TIMEOUT (its table
// locked by a migration, say) is answered 503 unavailable, saying the store
// did not answer in time, and logged as `export read timed out`: neither a
// 500 nor a hang until the gateway gives up.
func TestAReadPastTheQueryTimeoutIsA503(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	e := serveTimed(t, testenv.Postgres(t), signer, testReadAhead, 300*time.Millisecond)
	owner := e.owner(t)
	ctx := context.Background()
	tx := testenv.InTransaction(t, e.pool, "LOCK TABLE export_items IN ACCESS EXCLUSIVE MODE")
	defer tx.Rollback(ctx)
	for _, path := range []string{"/v1/export/items/coin-1", "/v1/export/items"} {
		resp := e.get(t, owner, path)
		if resp.status != 503 || resp.env.Error == nil || resp.env.Error.Code != "unavailable" ||
			!strings.Contains(resp.env.Error.Message, "did not answer in time") {
			t.Errorf("GET %s with its table locked past the query timeout = %d %s, want 503 unavailable, not answered in time", path, resp.status, resp.body)
		}
	}
	if n := strings.Count(e.logs.String(), `"msg":"export read timed out"`); n != 2 {
		t.Errorf("%d lines `export read timed out`, want 2:\n%s", n, e.logs.String())
	}
}
