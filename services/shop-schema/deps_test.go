package main

import (
	"os/exec"
	"strings"
	"testing"
)

// shop-schema calls shops on the internet and no database (its
// NetworkPolicy lets it reach none): it links no PostgreSQL client. The
// binaries' shared start (pkg/startup) once brought pgx in, through the
// stop while PostgreSQL was awaited, which shop-schema never waits for.
func TestLinksNoPostgreSQLClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/coinexport/export/pkg/postgres" || strings.HasPrefix(pkg, "github.com/jackc/") {
			t.Errorf("shop-schema links %s", pkg)
		}
	}
}
