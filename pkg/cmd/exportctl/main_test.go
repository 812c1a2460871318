package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/testenv"
)

// TestMain runs the tests in a zone other than UTC, as on an operator's
// laptop (set here, before any test's goroutine reads time.Local).
func TestMain(m *testing.M) {
	if os.Getenv(asExportctl) != "" { // a test's child process: exportctl itself (runExportctl)
		main()
		os.Exit(0)
	}
	time.Local = time.FixedZone("UTC+3", 3*60*60)
	os.Exit(testenv.Run(m))
}

// cli runs exportctl against dsn and decodes its --json output into out.
func cli(t *testing.T, dsn string, stdin string, out any, args ...string) error {
	t.Helper()
	var stdout bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return dsn
		}
		return ""
	}
	err := run(context.Background(), append(args, "--json"), getenv, strings.NewReader(stdin), &stdout, io.Discard)
	if err == nil && out != nil {
		if jerr := json.Unmarshal(stdout.Bytes(), out); jerr != nil {
			t.Fatalf("exportctl %v printed %q: not JSON: %v", args, stdout.String(), jerr)
		}
	}
	return err
}

func TestKeyRoundTrip(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	if err := cli(t, dsn, "", nil, "migrate"); err != nil {
		t.Fatalf("migrate = %v", err)
	}
	var owner struct{ ID string }
	if err := cli(t, dsn, "", &owner, "owner", "create", "--name", "Coins Ltd"); err != nil || owner.ID == "" {
		t.Fatalf("owner create = %+v, %v", owner, err)
	}
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1"); err != nil {
		t.Fatalf("platform create = %v", err)
	}

	var read, write createdKey
	if err := cli(t, dsn, "", &read, "key", "create", "--owner", owner.ID, "--scope", "export:read"); err != nil {
		t.Fatalf("key create read = %v", err)
	}
	if err := cli(t, dsn, "", &write, "key", "create", "--owner", owner.ID, "--scope", "sales:write", "--platform", "market-1"); err != nil {
		t.Fatalf("key create write = %v", err)
	}
	if !apikey.WellFormed(read.Key) || !strings.HasPrefix(read.Key, apikey.TagRead) || !strings.HasPrefix(write.Key, apikey.TagWrite) {
		t.Errorf("keys %q, %q: want well-formed read and write keys", read.Key, write.Key)
	}
	if write.PlatformID == nil || *write.PlatformID != "market-1" {
		t.Errorf("write key platform = %v, want market-1", write.PlatformID)
	}
	err := cli(t, dsn, "", nil, "key", "create", "--owner", owner.ID, "--scope", "sales:write")
	if !errors.Is(err, errUsage) {
		t.Errorf("key create sales:write without --platform = %v, want a usage error", err)
	}

	var listed []listedKey
	if err := cli(t, dsn, "", &listed, "key", "list", "--owner", owner.ID); err != nil || len(listed) != 2 {
		t.Fatalf("key list = %d keys, %v; want 2", len(listed), err)
	}
	var before bytes.Buffer // --json before the command, as a global flag
	if err := run(context.Background(), []string{"-json=true", "key", "list", "--owner", owner.ID},
		func(string) string { return dsn }, strings.NewReader(""), &before, io.Discard); err != nil {
		t.Fatalf("exportctl --json key list = %v", err)
	}
	if err := json.Unmarshal(before.Bytes(), &listed); err != nil || len(listed) != 2 {
		t.Errorf("exportctl --json key list printed %q (%v), want the 2 keys as JSON", before.String(), err)
	}
	raw, _ := json.Marshal(listed)
	if strings.Contains(string(raw), read.Key) || strings.Contains(string(raw), write.Key) {
		t.Errorf("key list shows a secret: %s", raw)
	}

	if err := cli(t, dsn, "", nil, "key", "revoke", read.ID); err != nil {
		t.Fatalf("key revoke = %v", err)
	}
	if err := cli(t, dsn, "", nil, "key", "revoke", "00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("key revoke of an unknown id = nil, want an error")
	}
	if err := cli(t, dsn, "", &listed, "key", "list", "--owner", owner.ID); err != nil {
		t.Fatal(err)
	}
	for _, k := range listed {
		if (k.ID == read.ID) != (k.RevokedAt != nil) {
			t.Errorf("key %s revoked_at = %v; want set only for the revoked read key", k.ID, k.RevokedAt)
		}
	}
}

const goodLine = `{"id":"coin-%d","coin_id":null,"status":"active","price":10.5,"currency":"EUR","stock_quantity":1,"category":null,"characteristics":{"metal":"silver"},"images":[{"id":"i1","url":"https://img.example.com/1.jpg","position":1,"type":"obverse"}],"texts":{"ENG":{"title":"Coin","description":"A coin"}}}`

func TestItemsImportAndSeed(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	var owner struct{ ID string }
	if err := cli(t, dsn, "", &owner, "owner", "create", "--name", "Importer"); err != nil {
		t.Fatal(err)
	}

	var lines []string
	for i := range 3 {
		lines = append(lines, strings.Replace(goodLine, "%d", string(rune('a'+i)), 1))
	}
	file := filepath.Join(t.TempDir(), "items.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var res map[string]int
	if err := cli(t, dsn, "", &res, "items", "import", "--owner", owner.ID, "--file", file); err != nil {
		t.Fatalf("items import = %v", err)
	}
	if res["inserted"] != 3 {
		t.Errorf("items import = %v, want 3 inserted", res)
	}

	// One malformed line (the third) rejects the whole file from stdin.
	bad := strings.Join([]string{
		strings.Replace(goodLine, "%d", "new-1", 1),
		strings.Replace(goodLine, "%d", "new-2", 1),
		`{"id":"new-3","status":"sold"}`,
	}, "\n")
	err := cli(t, dsn, bad, nil, "items", "import", "--owner", owner.ID, "--file", "-")
	if want := "standard input: nothing imported: line 3"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("import of a bad file = %v, want an error saying %q", err, want)
	}
	// The text an operator reads counts one item as one.
	var text bytes.Buffer
	err = run(context.Background(), []string{"items", "import", "--owner", owner.ID, "--file", "-"},
		func(string) string { return dsn }, strings.NewReader(strings.Replace(goodLine, "%d", "one", 1)), &text, io.Discard)
	if want := "imported 1 item: 1 inserted, 0 updated, 0 unchanged\n"; err != nil || text.String() != want {
		t.Errorf("import of one item printed %q, %v; want %q", text.String(), err, want)
	}

	var seeded map[string]float64
	if err := cli(t, dsn, "", &seeded, "items", "seed", "--owner", owner.ID, "--count", "500", "--seed", "7"); err != nil {
		t.Fatalf("items seed = %v", err)
	}
	text.Reset()
	err = run(context.Background(), []string{"items", "seed", "--owner", owner.ID, "--count", "1", "--seed", "8"},
		func(string) string { return dsn }, strings.NewReader(""), &text, io.Discard)
	if want := "seeded 1 item in "; err != nil || !strings.HasPrefix(text.String(), want) {
		t.Errorf("seed of one item printed %q, %v; want %q…", text.String(), err, want)
	}
	count := countItems(t, dsn, owner.ID)
	if count != 4+500+1 {
		t.Errorf("owner has %d items, want 505 (4 imported, none of the bad file, 501 seeded)", count)
	}
}

// An import that stops once its chunks are being written says how many
// items it wrote (committed, 1,000 a chunk) and to run it again, and one
// that stops before says that nothing was written: "upsert after 1000 of
// 3000 items: context canceled" said neither.
func TestItemsImportCutShortSaysWhatItWrote(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	if err := cli(t, dsn, pricedLines(1501, "1"), nil, "items", "import", "--owner", owner.ID, "--file", "-"); err != nil {
		t.Fatal(err)
	}
	// The second chunk's first item stays locked past the chunk's bound.
	testenv.InTransaction(t, testenv.Pool(t, dsn), `SELECT FROM export_items WHERE id = 'coin-1000' FOR UPDATE`)
	err := cli(t, dsn, pricedLines(3000, "2"), nil, "items", "import", "--owner", owner.ID, "--file", "-")
	if want := "stopped after writing 1000 of 3000 items"; err == nil || !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), "once that transaction has ended, run it again to complete it") {
		t.Errorf("import stopped at its second chunk = %v, want it to say %q, and to run it again", err, want)
	}

	// Ctrl-C while the file is read.
	ctx, cancel := context.WithCancel(context.Background())
	stdin := readerFunc(func(p []byte) (int, error) { cancel(); return copy(p, pricedLines(10, "3")), io.EOF })
	err = run(ctx, []string{"items", "import", "--owner", owner.ID, "--file", "-"},
		func(string) string { return dsn }, stdin, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "import: interrupted: nothing written") {
		t.Errorf("import cancelled before its first chunk = %v, want it to say that nothing was written", err)
	}
}

// An import that could not drop its staging table as it ended (a pg_dump
// held a lock on it) says so on its notes, with the table, why, when a
// later import drops it and the statement that drops it now, and still
// reports what it imported. The table stayed without a word.
func TestItemsImportSaysWhenItLeavesItsStagingTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	pool := testenv.Pool(t, dsn)
	lines := strings.NewReader(pricedLines(3, "1"))
	locked := false
	stdin := readerFunc(func(p []byte) (int, error) {
		n, err := lines.Read(p)
		if err == io.EOF && !locked { // the staging table exists once the file is read
			locked = true
			var table string
			if err := pool.QueryRow(ctx, `SELECT 'import_staging.' || staging FROM import_staging.runs`).Scan(&table); err != nil {
				return 0, err
			}
			// On the import's reading goroutine: an error, not t.Fatal.
			dump, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			t.Cleanup(func() { _ = dump.Rollback(context.Background()) })
			if _, err := dump.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS SHARE MODE"); err != nil {
				return 0, err
			}
		}
		return n, err
	})
	var out, notes bytes.Buffer
	err := run(ctx, []string{"items", "import", "--owner", owner.ID, "--file", "-"}, func(string) string { return dsn }, stdin, &out, &notes)
	if err != nil || !strings.Contains(out.String(), "imported 3 items: 3 inserted") {
		t.Fatalf("import = %v, printed %q; want 3 items imported", err, out.String())
	}
	var table string
	if err := pool.QueryRow(ctx, `SELECT staging FROM import_staging.runs`).Scan(&table); err != nil {
		t.Fatalf("the run left: %v", err)
	}
	for _, want := range []string{"warning: the import's staging table import_staging." + table + " could not be dropped",
		"another session holds a lock on it, as a pg_dump does while it runs: ERROR: canceling statement due to lock timeout", "the first import started 15 minutes from now drops it",
		`SET LOCAL lock_timeout = '5s'; DROP TABLE IF EXISTS "import_staging"."` + table + `"; DELETE FROM import_staging.runs WHERE staging = '` + table + "'"} {
		if !strings.Contains(notes.String(), want) {
			t.Errorf("notes = %q, want %q in them", notes.String(), want)
		}
	}
}

// readerFunc is a function as an io.Reader.
type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// An item id that cannot travel as one URL path segment could be listed
// but never read nor sold, so the import refuses the file, naming the line.
func TestItemsImportRefusesUnaddressableIDs(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	var owner struct{ ID string }
	if err := cli(t, dsn, "", &owner, "owner", "create", "--name", "Importer"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, reason string }{
		{"x/y", `id: must not contain "/" or "\"`},
		{`x\\y`, `id: must not contain "/" or "\"`},
		{"..", `id: must not be "." or ".."`},
		{".", `id: must not be "." or ".."`},
	} {
		file := strings.Join([]string{
			strings.Replace(goodLine, "coin-%d", "ok-1", 1),
			strings.Replace(goodLine, "coin-%d", tc.id, 1),
		}, "\n")
		err := cli(t, dsn, file, nil, "items", "import", "--owner", owner.ID, "--file", "-")
		if err == nil || !strings.Contains(err.Error(), "line 2: "+tc.reason) {
			t.Errorf("items import of id %q = %v, want an error naming line 2 and %q", tc.id, err, tc.reason)
		}
	}
	if n := countItems(t, dsn, owner.ID); n != 0 {
		t.Errorf("owner has %d items after refused imports, want 0", n)
	}
}

// createdOwner is what owner create prints as JSON.
type createdOwner struct{ ID string }

// newOwner creates an owner named Coins Ltd with exportctl.
func newOwner(t *testing.T, dsn string) createdOwner {
	t.Helper()
	var owner createdOwner
	if err := cli(t, dsn, "", &owner, "owner", "create", "--name", "Coins Ltd"); err != nil {
		t.Fatal(err)
	}
	return owner
}

// newReadKey creates an owner (newOwner) and an export:read key of it.
func newReadKey(t *testing.T, dsn string) (createdOwner, createdKey) {
	t.Helper()
	owner := newOwner(t, dsn)
	var key createdKey
	if err := cli(t, dsn, "", &key, "key", "create", "--owner", owner.ID, "--scope", "export:read"); err != nil {
		t.Fatal(err)
	}
	return owner, key
}

func countItems(t *testing.T, dsn, owner string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM export_items WHERE owner_id = $1", owner).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Asking for help prints the usage and is no error, without a database.
func TestHelpIsNoError(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"help", "key", "create"}, {"--json", "help"}, {"--json", "help", "key", "create"}, {"key", "create", "-h"}, {"items", "seed", "--owner", "x", "--help"}} {
		var stdout bytes.Buffer
		err := run(context.Background(), args, func(string) string { return "" }, strings.NewReader(""), &stdout, io.Discard)
		if err != nil || !strings.Contains(stdout.String(), "usage: exportctl") {
			t.Errorf("exportctl %v = %v, printed %q; want the usage and no error", args, err, stdout.String())
		}
	}
	if err := run(context.Background(), []string{"--nope"}, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard); !errors.Is(err, errUsage) {
		t.Errorf("exportctl --nope = %v, want a usage error", err)
	}
	// With nothing at all the administrator is told what is missing, not
	// that "" is an unknown command.
	err := run(context.Background(), nil, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "no command given") {
		t.Errorf("exportctl with no arguments = %v, want the usage error \"no command given\"", err)
	}
}

// An administrator's mistake is named in their terms (the owner, the
// platform, the id's rule), never as a constraint or an SQLSTATE, and a
// read key is not bound to a platform.
func TestMistakesAreNamed(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	if err := cli(t, dsn, "", nil, "migrate"); err != nil {
		t.Fatalf("migrate = %v", err)
	}
	owner := newOwner(t, dsn)
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1"); err != nil {
		t.Fatal(err)
	}
	const unknownOwner = "00000000-0000-0000-0000-000000000000"
	for _, tc := range []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{"key", "create", "--owner", unknownOwner, "--scope", "export:read"}, false, `no owner with id "` + unknownOwner + `"`},
		{[]string{"key", "create", "--owner", "not-a-uuid", "--scope", "export:read"}, true, `--owner "not-a-uuid" is not an owner id (a UUID)`},
		{[]string{"key", "create", "--owner", owner.ID, "--scope", "sales:write", "--platform", "nope"}, false, `no platform with id "nope"`},
		{[]string{"key", "create", "--owner", owner.ID, "--scope", "export:read", "--platform", "market-1"}, true, "an export:read key is bound to its owner only"},
		{[]string{"platform", "create", "--id", "market-1"}, false, `platform "market-1" exists already`},
		{[]string{"platform", "create", "--id", "bad/id"}, false, `platform id "bad/id": 1 to 64 letters, digits`},
		{[]string{"key", "list", "--owner", unknownOwner}, false, `no owner with id "` + unknownOwner + `"`},
		{[]string{"key", "list", "--owner", "zz"}, true, `--owner "zz" is not an owner id`},
		{[]string{"key", "list", "--owner", strings.Replace(unknownOwner, "-", "x", 1)}, true, "is not an owner id"},
		{[]string{"items", "import", "--owner", unknownOwner, "--file", "-"}, false, `no owner with id "` + unknownOwner + `"`},
		{[]string{"items", "import", "--owner", "not-a-uuid", "--file", "-"}, true, `--owner "not-a-uuid" is not an owner id (a UUID)`},
		{[]string{"items", "seed", "--owner", unknownOwner, "--count", "3"}, false, `no owner with id "` + unknownOwner + `"`},
		{[]string{"items", "seed", "--owner", owner.ID, "--count", "0"}, true, "--count must be a positive number"},
		{[]string{"owner", "create", "--name", strings.Repeat("é", 201)}, true, "--name must be 1 to 200 characters, not blank (got 201)"},
		{[]string{"owner", "create", "--name", "  "}, true, "--name must be 1 to 200 characters, not blank"},
	} {
		err := cli(t, dsn, "", nil, tc.args...)
		switch {
		case err == nil:
			t.Errorf("exportctl %v = nil, want an error saying %q", tc.args, tc.want)
		case !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SQLSTATE"):
			t.Errorf("exportctl %v = %v, want it to say %q (and no SQLSTATE)", tc.args, err, tc.want)
		case errors.Is(err, errUsage) != tc.usage:
			t.Errorf("exportctl %v = %v: usage error %v, want %v", tc.args, err, errors.Is(err, errUsage), tc.usage)
		}
	}
	var keys []listedKey
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 0 {
		t.Errorf("keys after the refused creations = %+v, %v; want none", keys, err)
	}
	// Seeding a seed twice names the seed, not the table's key.
	if err := cli(t, dsn, "", nil, "items", "seed", "--owner", owner.ID, "--count", "2", "--seed", "5"); err != nil {
		t.Fatal(err)
	}
	err := cli(t, dsn, "", nil, "items", "seed", "--owner", owner.ID, "--count", "2", "--seed", "5")
	if err == nil || !strings.Contains(err.Error(), "items of seed 5 already") || strings.Contains(err.Error(), "SQLSTATE") {
		t.Errorf("items seed of a seed already seeded = %v, want it to name the seed (and no SQLSTATE)", err)
	}
	// An owner id in capitals names the same owner.
	if err := cli(t, dsn, "", nil, "key", "create", "--owner", owner.ID, "--scope", "export:read"); err != nil {
		t.Fatal(err)
	}
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", strings.ToUpper(owner.ID)); err != nil || len(keys) != 1 {
		t.Errorf("key list with the owner id in capitals = %+v, %v; want the owner's key", keys, err)
	}
}

// Both ids are UUIDs: an owner's id given to key revoke, or a key's id
// given as --owner, is named for what it is, not only as "no key" or "no
// owner" with that id.
func TestOwnerAndKeyIDsMixedUpAreNamed(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner, key := newReadKey(t, dsn)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"key", "revoke", owner.ID}, "no key with id " + `"` + owner.ID + `": it is an owner's id`},
		{[]string{"key", "list", "--owner", key.ID}, "no owner with id " + `"` + key.ID + `": it is a key's id`},
		{[]string{"key", "create", "--owner", key.ID, "--scope", "export:read"}, "no owner with id " + `"` + key.ID + `": it is a key's id`},
		{[]string{"items", "import", "--owner", key.ID, "--file", "-"}, "no owner with id " + `"` + key.ID + `": it is a key's id`},
	} {
		if err := cli(t, dsn, "", nil, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("exportctl %v = %v, want it to say %q", tc.args, err, tc.want)
		}
	}
}

// A command missing several flags names the first the usage lists, the
// same one every time (a map of them named one at random).
func TestMissingFlagsAreNamedInUsageOrder(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"key", "create"}, "--owner is required"},
		{[]string{"key", "create", "--scope", "export:read"}, "--owner is required"},
		{[]string{"items", "import"}, "--owner is required"},
		{[]string{"items", "import", "--owner", "00000000-0000-0000-0000-000000000000"}, "--file is required"},
	} {
		for range 20 {
			if err := cli(t, dsn, "", nil, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errUsage) {
				t.Errorf("exportctl %v = %v, want a usage error saying %q", tc.args, err, tc.want)
				break
			}
		}
	}
}

// A word outside a flag is refused, not dropped: dropped, it would make an
// owner of another name, a key without the scope typed after a space, or
// import one file of two. A flag given twice is refused too.
func TestStrayArgumentsAreRefused(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "items.jsonl")
	if err := os.WriteFile(file, []byte(strings.Replace(goodLine, "%d", "1", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"migrate", "now"},
		{"owner", "create", "--name", "Acme", "Coins"},
		{"platform", "create", "--id", "market-2", "Market", "Two"},
		{"key", "create", "--owner", owner.ID, "--scope", "export:read", "sales:write"},
		{"key", "create", "--owner", owner.ID, "--scope", "sales:write", "--platform", "market-1", "--name", "east", "coast"},
		{"key", "list", "--owner", owner.ID, "extra"},
		{"items", "import", "--owner", owner.ID, "--file", file, file},
		{"items", "seed", "--owner", owner.ID, "--count", "3", "7"},
	} {
		err := cli(t, dsn, "", nil, args...)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "takes flags only") {
			t.Errorf("exportctl %v = %v, want a usage error naming the stray argument", args, err)
		}
	}
	// Nor is a flag given twice read as its last value: "--scope export:read
	// --scope sales:write" made a key without export:read, and "--owner A
	// ... --owner B" a key of B.
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"key", "create", "--owner", owner.ID, "--scope", "export:read", "--scope", "sales:write", "--platform", "market-1"}, "--scope"},
		{[]string{"key", "create", "--owner", owner.ID, "--scope", "export:read", "--owner=" + owner.ID}, "--owner"},
		{[]string{"owner", "create", "--name", "Acme", "-name", "Coins"}, "--name"},
		{[]string{"items", "import", "--owner", owner.ID, "--file", file, "--file", file}, "--file"},
	} {
		err := cli(t, dsn, "", nil, tc.args...)
		if want := tc.flag + " is given twice"; !errors.Is(err, errUsage) || !strings.Contains(err.Error(), want) {
			t.Errorf("exportctl %v = %v, want a usage error saying %q", tc.args, err, want)
		}
		// Joining with a comma is the advice for --scope alone.
		if hint := "join scopes with a comma"; err != nil && strings.Contains(err.Error(), hint) != (tc.flag == "--scope") {
			t.Errorf("exportctl %v = %v: %q is said of --scope alone", tc.args, err, hint)
		}
	}
	// A switch given twice says the same thing twice: no harm.
	if err := cli(t, dsn, "", nil, "--json", "key", "list", "--owner", owner.ID, "--json"); err != nil {
		t.Errorf("exportctl --json key list --json = %v, want it to list the keys", err)
	}
	var keys []listedKey
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 0 {
		t.Errorf("keys after the refused commands = %+v, %v; want none", keys, err)
	}
	if n := countItems(t, dsn, owner.ID); n != 0 {
		t.Errorf("owner has %d items after the refused commands, want 0", n)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var owners, platforms int
	if err := conn.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM owners), (SELECT count(*) FROM platforms)").Scan(&owners, &platforms); err != nil {
		t.Fatal(err)
	}
	if owners != 1 || platforms != 1 {
		t.Errorf("%d owners, %d platforms after the refused commands, want 1 and 1", owners, platforms)
	}
}

// A leaked key is what an administrator has in hand: key revoke takes it
// as well as the key's id, finds it by its hash, and prints only the id.
func TestKeyRevokeByKey(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner, key := newReadKey(t, dsn)
	var stdout bytes.Buffer
	err := run(context.Background(), []string{"key", "revoke", key.Key},
		func(string) string { return dsn }, strings.NewReader(""), &stdout, io.Discard)
	if err != nil || stdout.String() != "revoked key "+key.ID+"\n" {
		t.Errorf("key revoke <key> = %v, printed %q; want %q", err, stdout.String(), "revoked key "+key.ID+"\n")
	}
	var keys []listedKey
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Errorf("key list after key revoke <key> = %+v, %v; want the key revoked", keys, err)
	}
	// Again, pasted with a line end: the key still, revoked already.
	stdout.Reset()
	err = run(context.Background(), []string{"key", "revoke", key.Key + "\n"},
		func(string) string { return dsn }, strings.NewReader(""), &stdout, io.Discard)
	if err != nil || !strings.HasPrefix(stdout.String(), "key "+key.ID+" was revoked already, at ") {
		t.Errorf("key revoke <key> again = %v, printed %q; want it to say the key was revoked already", err, stdout.String())
	}

	other, _, err := apikey.Generate([]string{"export:read"}) // well formed, never issued
	if err != nil {
		t.Fatal(err)
	}
	err = cli(t, dsn, "", nil, "key", "revoke", other)
	if err == nil || strings.Contains(err.Error(), other) {
		t.Errorf("key revoke of a key never issued = %v, want an error that does not quote the key", err)
	}
}

// A key whose secret could not be printed (a full disk, a closed pipe)
// is revoked at once: nobody holds its secret, and it stayed active in key
// list with the command's error alone to tell why. So is one whose print
// failed as Ctrl-C stopped it (a pipeline interrupted whole): the revoke
// does not stop with the command.
func TestKeyCreateRevokesAKeyItCouldNotPrint(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	for _, interrupted := range []bool{false, true} {
		owner := newOwner(t, dsn)
		ctx, cancel := context.WithCancel(context.Background())
		full := writerFunc(func([]byte) (int, error) {
			if interrupted {
				cancel()
			}
			return 0, errors.New("no space left on device")
		})
		err := run(ctx, []string{"key", "create", "--owner", owner.ID, "--scope", "export:read"},
			func(string) string { return dsn }, strings.NewReader(""), full, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "revoked it") {
			t.Errorf("key create printing to a full disk (interrupted: %v) = %v, want the write's error and that the key was revoked", interrupted, err)
		}
		var keys []listedKey
		if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 1 || keys[0].RevokedAt == nil {
			t.Errorf("key list after the key could not be printed (interrupted: %v) = %+v, %v; want the one key, revoked", interrupted, keys, err)
		}
	}
}

// A key printed to a pipe whose reader has gone (a script's "| head -c0",
// a terminal closed) is revoked as one printed to a full disk: Go ends a
// process that writes to such a pipe on its stdout with SIGPIPE, before
// the write's error reached key create, and the key stayed active.
func TestKeyCreateRevokesAKeyItPrintedToAClosedPipe(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	read, write, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	read.Close()
	defer write.Close()
	cmd := runExportctl(dsn, "key", "create", "--owner", owner.ID, "--scope", "export:read")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = write, &stderr
	err = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(stderr.String(), "revoked it") {
		t.Errorf("key create printing to a closed pipe: %v (exit %d), stderr %q; want exit 1 saying the key was revoked", err, code, stderr.String())
	}
	var keys []listedKey
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Errorf("key list after the key was printed to a closed pipe = %+v, %v; want the one key, revoked", keys, err)
	}
}

// asExportctl, set, makes the test binary exportctl (TestMain).
const asExportctl = "EXPORTCTL_TEST_AS_MAIN"

// runExportctl is exportctl run as a process of its own (the test binary,
// asExportctl), for what only a process shows: its signals, its exit status.
func runExportctl(dsn string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asExportctl+"=1", "DATABASE_URL="+dsn)
	return cmd
}

// writerFunc is a function as an io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// key revoke - reads the key (or its id) from standard input, which keeps
// a key that is still valid out of ps and the shell's history.
func TestKeyRevokeReadsTheKeyFromStandardInput(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, key := newReadKey(t, dsn)
	// A key, then past the bound on what is read, a line more: not the key
	// alone (the second line would stay unread, its key unrevoked).
	beyond := key.Key + strings.Repeat(" ", 5000) + "\n" + key.Key + "\n"
	for _, stdin := range []string{"", "\n", key.Key + "\n" + key.Key + "\n", beyond} {
		err := cli(t, dsn, stdin, nil, "key", "revoke", "-")
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "one line") || strings.Contains(err.Error(), key.Key[4:20]) {
			t.Errorf("key revoke - of %d bytes = %v, want a usage error asking for one line (and quoting no key)", len(stdin), err)
		}
	}
	var revoked struct{ ID string }
	if err := cli(t, dsn, key.Key+"\n", &revoked, "key", "revoke", "-"); err != nil || revoked.ID != key.ID {
		t.Errorf("key revoke - with the key on standard input = %+v, %v; want key %s revoked", revoked, err, key.ID)
	}
}

// key revoke - from a pipe its writer keeps open stops at Ctrl-C, nothing
// revoked: it read on until the pipe closed.
func TestKeyRevokeFromAPipeHeldOpenStopsAtCtrlC(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	owner, key := newReadKey(t, dsn)
	stdin, writer := io.Pipe()
	defer writer.Close()
	ctx, ctrlC := context.WithCancel(context.Background())
	defer ctrlC()
	revoked := make(chan error, 1)
	go func() {
		revoked <- run(ctx, []string{"key", "revoke", "-"}, func(string) string { return dsn }, stdin, io.Discard, io.Discard)
	}()
	// A pipe's write returns once it is read: the revoke is reading then,
	// and the pipe stays open. Closed after 5 s, so that a revoke that
	// waits for it ends.
	if _, err := io.WriteString(writer, key.Key+"\n"); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(5*time.Second, func() { writer.Close() })
	ctrlC()
	if err := <-revoked; err == nil || !strings.Contains(err.Error(), "before standard input ended: nothing revoked") {
		t.Errorf("key revoke - stopped while its pipe was open = %v, want it to stop, nothing revoked", err)
	}
	var keys []listedKey
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 1 || keys[0].RevokedAt != nil {
		t.Errorf("key list after the stopped revoke = %+v, %v; want the key, not revoked", keys, err)
	}
}

// key revoke takes a key's id in either case, and names what else it was
// given instead of looking for "a key with id" that no key can have: a key
// mistyped or cut short (its checksum fails), a key's prefix as key list
// prints it, a word that is neither. None of them revokes anything, and
// none is quoted when it holds most of a key.
func TestKeyRevokeNamesWhatItWasGiven(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner, key := newReadKey(t, dsn)
	last := key.Key[len(key.Key)-1:]
	mistyped := key.Key[:len(key.Key)-1] + map[bool]string{true: "B", false: "A"}[last == "A"]
	for _, tc := range []struct{ name, arg, want string }{
		{"mistyped key", mistyped, "looks like a key, but its checksum does not match"},
		{"key cut short", key.Key[:30], "looks like a key, but its checksum does not match"},
		{"key's prefix", key.Prefix + "…", "a key's prefix, as key list prints it"},
		{"key's prefix", key.Prefix, "a key's prefix, as key list prints it"},
		{"neither", "nonsense", `"nonsense" is neither a key id (a UUID) nor a key`},
	} {
		err := cli(t, dsn, "", nil, "key", "revoke", tc.arg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), key.Key[4:20]) {
			t.Errorf("key revoke <%s> = %v, want it to say %q (and quote no key)", tc.name, err, tc.want)
		}
	}
	var keys []listedKey
	if err := cli(t, dsn, "", &keys, "key", "list", "--owner", owner.ID); err != nil || len(keys) != 1 || keys[0].RevokedAt != nil {
		t.Fatalf("key list after the refused revocations = %+v, %v; want the key active", keys, err)
	}
	var revoked struct{ ID string }
	if err := cli(t, dsn, "", &revoked, "key", "revoke", strings.ToUpper(key.ID)); err != nil || revoked.ID != key.ID {
		t.Errorf("key revoke <id in capitals> = %+v, %v; want key %s revoked", revoked, err, key.ID)
	}
}

// A key without its tag is its whole secret (a client that cut the key at
// its '_' sent the rest): key revoke finds the key by it, as by the key.
func TestKeyRevokeTakesAKeyWithoutItsTag(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, key := newReadKey(t, dsn)
	var revoked struct{ ID string }
	if err := cli(t, dsn, "", &revoked, "key", "revoke", key.Key[strings.IndexByte(key.Key, '_')+1:]); err != nil || revoked.ID != key.ID {
		t.Errorf("key revoke <the key without its tag> = %+v, %v; want key %s revoked", revoked, err, key.ID)
	}
}

// No key reaches standard error, whatever argument quoted it.
func TestRedactKeys(t *testing.T) {
	key, _, err := apikey.Generate([]string{"sales:write"})
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{
		`no key with id "` + key + `"`,
		`invalid usage: --owner "` + key + `" is not an owner id (a UUID)`,
		`invalid usage: key list takes flags only, not "` + strings.ToUpper(key[:3]) + "-" + key[4:30] + `"`,
		"unknown command " + key,
		`invalid usage: --owner "` + key[4:] + `" is not an owner id (a UUID)`, // without its tag: the whole secret
	} {
		got := redactKeys(msg)
		if apikey.ContainsKeyLike(got) || !strings.Contains(got, "[a key, not shown]") {
			t.Errorf("redactKeys(%q) = %q, want the key replaced", msg, got)
		}
	}
	if msg := `no key with id "6f1c0e1e-0000-4000-8000-000000000000"`; redactKeys(msg) != msg {
		t.Errorf("redactKeys(%q) = %q, want it unchanged", msg, redactKeys(msg))
	}
}

// A key pasted with a space (or a quote) inside it is still most of a
// secret: what follows the break is hidden too, not only the run that
// starts at the tag. Before, "cxr_ <rest>" printed the whole rest of the
// key, and its checksum lets anyone confirm a guess of what was hidden.
func TestRedactKeysBrokenByASpaceOrAQuote(t *testing.T) {
	key, _, err := apikey.Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []int{4, 6, 20, 30, 45} {
		for _, sep := range []string{" ", "  ", `"`} {
			arg := key[:at] + sep + key[at:]
			for _, msg := range []string{
				fmt.Sprintf("no key with id %q", arg),
				fmt.Sprintf("invalid usage: --owner %q is not an owner id (a UUID)", arg),
				fmt.Sprintf("invalid usage: unknown command %q", "key revok "+arg),
			} {
				got := redactKeys(msg)
				for i := 4; i+8 <= len(key); i++ {
					if strings.Contains(got, key[i:i+8]) {
						t.Errorf("redactKeys(%q) = %q: it shows %q of the key", msg, got, key[i:i+8])
						break
					}
				}
			}
		}
	}
	if msg := `--owner "` + key + `" is not an owner id (a UUID)`; !strings.HasSuffix(redactKeys(msg), `" is not an owner id (a UUID)`) {
		t.Errorf("redactKeys(%q) = %q, want the text after the quoted key kept", msg, redactKeys(msg))
	}
}

// key list shows what a key is bound to, so that a rotation can issue its
// replacement with the same binding.
func TestKeyListShowsBinding(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1"); err != nil {
		t.Fatal(err)
	}
	if err := cli(t, dsn, "", nil, "key", "create", "--owner", owner.ID, "--scope", "sales:write",
		"--platform", "market-1", "--name", "east-shop"); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"key", "list", "--owner", owner.ID},
		func(string) string { return dsn }, strings.NewReader(""), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sales:write", "platform market-1", `"east-shop"`, "active"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("key list printed %q, want it to hold %q", stdout.String(), want)
		}
	}
}

// Every time exportctl prints is in UTC, whatever the zone of the host it
// runs on: key list printed the operator's local time ("revoked
// 2026-11-30T08:49:34+01:00") where owner list and key revoke said UTC.
func TestTimesArePrintedInUTC(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner, key := newReadKey(t, dsn)
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1"); err != nil {
		t.Fatal(err)
	}
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([^.\d]\S*?)["\s]`)
	for _, args := range [][]string{
		{"key", "revoke", key.ID}, {"key", "revoke", key.ID}, {"--json", "key", "revoke", key.ID},
		{"key", "list", "--owner", owner.ID}, {"--json", "key", "list", "--owner", owner.ID},
		{"owner", "list"}, {"--json", "owner", "list"}, {"platform", "list"}, {"--json", "platform", "list"},
	} {
		var stdout bytes.Buffer
		if err := run(context.Background(), args, func(string) string { return dsn }, strings.NewReader(""), &stdout, io.Discard); err != nil {
			t.Fatalf("exportctl %v = %v", args, err)
		}
		found := stamp.FindAllStringSubmatch(stdout.String()+"\n", -1)
		if len(found) == 0 && args[len(args)-2] != "revoke" {
			t.Errorf("exportctl %v printed %q: no time in it", args, stdout.String())
		}
		for _, m := range found {
			if m[2] != "Z" {
				t.Errorf("exportctl %v printed %q, in zone %q: want UTC (Z)", args, m[0], m[2])
			}
		}
	}
}

// migrate names each migration it applied (00004 and 00005 ask for a
// restart of the services after them), says when there was none to apply,
// and says when the database is newer than this build.
func TestMigrateNamesWhatItApplied(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var latest int64
	if err := conn.QueryRow(ctx, "SELECT max(version_id) FROM goose_db_version").Scan(&latest); err != nil {
		t.Fatal(err)
	}
	provider, _ := migratedDownTo(t, dsn, latest-1)

	migrate := func() string {
		t.Helper()
		var stdout bytes.Buffer
		if err := run(ctx, []string{"migrate"}, func(string) string { return dsn }, strings.NewReader(""), &stdout, io.Discard); err != nil {
			t.Fatalf("migrate = %v", err)
		}
		return stdout.String()
	}
	last := provider.ListSources()[len(provider.ListSources())-1]
	if got, want := migrate(), fmt.Sprintf("applied %s (", filepath.Base(last.Path)); !strings.HasPrefix(got, want) ||
		!strings.HasSuffix(got, fmt.Sprintf("schema is up to date (version %d)\n", latest)) {
		t.Errorf("migrate one behind printed %q, want %q… and the version", got, want)
	}
	if got, want := migrate(), fmt.Sprintf("schema is up to date (version %d): nothing to apply\n", latest); got != want {
		t.Errorf("migrate again printed %q, want %q", got, want)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)", latest+1); err != nil {
		t.Fatal(err)
	}
	if got, want := migrate(), fmt.Sprintf("the database is at version %d, newer than this exportctl's %d", latest+1, latest); !strings.Contains(got, want) {
		t.Errorf("migrate of a newer database printed %q, want it to say %q", got, want)
	}
}

// migrate holds two connections at once, which the pool-sizing sum counts
// (README, EXPORT_READER_DB_MAX_CONNS; deploy/k8s's HPA comment): its
// pool's, opened by its start-up check and then the migrations', and the
// migration lock's own (schema.Up). A role allowed two migrates a new
// database of its own from the start; allowed one, it was refused 53300 at
// the second connection.
func TestMigrateHoldsTwoConnectionsAtMost(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	admin := testenv.Pool(t, dsn)
	exec := func(stmt string) {
		t.Helper()
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	name := fmt.Sprintf("migrate_%d", time.Now().UnixNano())
	// Not a superuser: a role's CONNECTION LIMIT does not bind one.
	exec("CREATE ROLE " + name + " LOGIN CONNECTION LIMIT 2")
	exec("CREATE DATABASE " + name + " OWNER " + name)
	t.Cleanup(func() {
		exec("DROP DATABASE " + name + " WITH (FORCE)")
		exec("DROP ROLE " + name)
	})
	limited := dsn + " user=" + name + " dbname=" + name
	var stdout bytes.Buffer
	if err := run(ctx, []string{"migrate"}, func(string) string { return limited }, strings.NewReader(""), &stdout, io.Discard); err != nil {
		t.Fatalf("migrate within 2 connections = %v", err)
	}
	if !strings.Contains(stdout.String(), "schema is up to date") {
		t.Errorf("migrate printed %q, want every migration applied", stdout.String())
	}
}

// migratedDownTo rolls the database at dsn back to version with goose, over
// the embedded migrations' files, and returns the provider and the
// connection it used (closed at the test's end).
func migratedDownTo(t *testing.T, dsn string, version int64) (*goose.Provider, *sql.DB) {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("../../schema/migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(context.Background(), version); err != nil {
		t.Fatalf("down to %d: %v", version, err)
	}
	return provider, db
}

// With --json, a migration that fails after others applied names them in
// its error: nothing goes to stdout then, and 00004 and 00005 ask for a
// restart of the services once applied.
func TestMigrateJSONNamesWhatItAppliedBeforeAFailure(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	_, db := migratedDownTo(t, dsn, 4)
	// 00006 creates this table: it fails, after 00005 applied.
	if _, err := db.ExecContext(ctx, "CREATE TABLE idempotency_refusals (x int)"); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	err := run(ctx, []string{"--json", "migrate"}, func(string) string { return dsn }, strings.NewReader(""), &stdout, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "applied before it: 00005_") || stdout.Len() != 0 {
		t.Errorf("migrate --json failing at 00006 = %v, stdout %q; want the error to name 00005, nothing on stdout", err, stdout.String())
	}
}

// A migration that fails on a missing table is not told to run exportctl
// migrate, which it is: the advice is for the other commands.
func TestMigrateFailingOnAMissingTableIsNotToldToMigrate(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, db := migratedDownTo(t, dsn, 6)
	// 00007 alters this table.
	if _, err := db.Exec("DROP TABLE idempotency_refusals"); err != nil {
		t.Fatal(err)
	}
	err := cli(t, dsn, "", nil, "migrate")
	if err == nil || !strings.Contains(err.Error(), "idempotency_refusals") || strings.Contains(err.Error(), "run exportctl migrate") {
		t.Errorf("migrate failing on a missing table = %v, want the failure without the advice to run exportctl migrate", err)
	}
}

// An owner's id is printed once, by owner create; owner list and platform
// list give back what every other command needs.
func TestOwnerAndPlatformList(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1", "--name", "Market One"); err != nil {
		t.Fatal(err)
	}
	var owners, platforms []listed
	if err := cli(t, dsn, "", &owners, "owner", "list"); err != nil || len(owners) != 1 ||
		owners[0].ID != owner.ID || owners[0].Name != "Coins Ltd" {
		t.Errorf("owner list = %+v, %v; want the one owner", owners, err)
	}
	if err := cli(t, dsn, "", &platforms, "platform", "list"); err != nil || len(platforms) != 1 ||
		platforms[0].ID != "market-1" || platforms[0].Name != "Market One" {
		t.Errorf("platform list = %+v, %v; want the one platform", platforms, err)
	}
}

// items restamp stamps every item of the owner it is given (more than one
// chunk of them), or of every owner, later than any stamp before, and
// changes no other owner's items; it takes exactly one of its two flags.
func TestItemsRestamp(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	a, b := newOwner(t, dsn), newOwner(t, dsn)
	for _, o := range []struct {
		id    string
		count string
	}{{a.ID, "1500"}, {b.ID, "3"}} {
		if err := cli(t, dsn, "", nil, "items", "seed", "--owner", o.id, "--count", o.count); err != nil {
			t.Fatalf("items seed = %v", err)
		}
	}
	aBefore, bBefore := stampRange(t, dsn, a.ID), stampRange(t, dsn, b.ID)

	var res map[string]float64
	if err := cli(t, dsn, "", &res, "items", "restamp", "--owner", a.ID); err != nil {
		t.Fatalf("items restamp --owner = %v", err)
	}
	if res["restamped"] != 1500 || res["owners"] != 1 {
		t.Errorf("items restamp --owner = %v, want 1500 items of 1 owner", res)
	}
	aAfter := stampRange(t, dsn, a.ID)
	if !aAfter[0].After(aBefore[1]) {
		t.Errorf("owner a's earliest stamp after the restamp is %v, not after its latest before, %v", aAfter[0], aBefore[1])
	}
	if got := stampRange(t, dsn, b.ID); got != bBefore {
		t.Errorf("owner b's stamps moved from %v to %v: only --owner a was restamped", bBefore, got)
	}

	if err := cli(t, dsn, "", &res, "items", "restamp", "--all-owners"); err != nil {
		t.Fatalf("items restamp --all-owners = %v", err)
	}
	if res["restamped"] != 1503 || res["owners"] != 2 {
		t.Errorf("items restamp --all-owners = %v, want 1503 items of 2 owners", res)
	}
	if got := stampRange(t, dsn, b.ID); !got[0].After(bBefore[1]) {
		t.Errorf("owner b's earliest stamp after --all-owners is %v, not after its latest before, %v", got[0], bBefore[1])
	}

	for _, args := range [][]string{{}, {"--owner", a.ID, "--all-owners"}} {
		err := cli(t, dsn, "", nil, append([]string{"items", "restamp"}, args...)...)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--owner OWNER_ID or --all-owners") {
			t.Errorf("items restamp %v = %v, want the usage error naming both flags", args, err)
		}
	}

	// The text an operator reads counts one owner, or one item, as one.
	one := newOwner(t, dsn)
	if err := cli(t, dsn, "", nil, "items", "seed", "--owner", one.ID, "--count", "1"); err != nil {
		t.Fatalf("items seed = %v", err)
	}
	getenv := func(k string) string { return map[string]string{"DATABASE_URL": dsn}[k] }
	for owner, want := range map[string]string{b.ID: "restamped 3 items of 1 owner in ", one.ID: "restamped 1 item of 1 owner in "} {
		var text bytes.Buffer
		if err := run(context.Background(), []string{"items", "restamp", "--owner", owner}, getenv, strings.NewReader(""), &text, io.Discard); err != nil ||
			!strings.HasPrefix(text.String(), want) {
			t.Errorf("items restamp --owner printed %q, %v; want it to start with %q", text.String(), err, want)
		}
	}
}

// stampRange is the earliest and the latest updated_at of owner's items.
func stampRange(t *testing.T, dsn, owner string) (r [2]time.Time) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(context.Background(), "SELECT min(updated_at), max(updated_at) FROM export_items WHERE owner_id = $1", owner).Scan(&r[0], &r[1]); err != nil {
		t.Fatal(err)
	}
	return r
}

// DATABASE_URL is read as the services read it: blank is unset, and a
// value that is no connection string is named, not quoted.
func TestDatabaseURLMistakesAreNamed(t *testing.T) {
	for dsn, want := range map[string]string{
		"":    "DATABASE_URL is not set",
		" \n": "DATABASE_URL is not set",
		"postgress://u:s3cret@db/app?sslmode=require": "DATABASE_URL must be a PostgreSQL connection string",
		"Host=db user=u password=s3cret":              "DATABASE_URL writes the keyword Host, which PostgreSQL reads in lower case only (host)",
	} {
		err := cli(t, dsn, "", nil, "owner", "list")
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("exportctl owner list with DATABASE_URL=%q = %v, want %q", dsn, err, want)
		}
	}
}

// What PostgreSQL refuses comes with what puts it right (postgres.Cause),
// as in the services' log lines: exportctl printed the server's words
// alone, its operator being the one to act.
func TestRefusalsNameTheirCause(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	pool := testenv.Pool(t, dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	role := pgx.Identifier{cfg.Database + "_nologin"}.Sanitize() // a role is the cluster's: named after the test's database
	if _, err := pool.Exec(context.Background(), "CREATE ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	const wrongPassword = "not-the-roles-password"
	for _, tt := range []struct{ name, dsn, args, want string }{
		{"database missing (3D000)", dsn + " dbname=" + cfg.Database + "_missing", "owner list", "DATABASE_URL's database does not exist"},
		{"role made NOLOGIN (28000)", dsn + " user=" + cfg.Database + "_nologin", "owner list", "PostgreSQL refused DATABASE_URL's role"},
		{"password refused (28P01)", testenv.PasswordCluster(t).DSN + " password=" + wrongPassword, "owner list", "PostgreSQL refused the password of DATABASE_URL's role"},
		{"read-only (25006)", dsn + " default_transaction_read_only=on", "owner create --name x", "point DATABASE_URL at the primary"},
	} {
		err := cli(t, tt.dsn, "", nil, strings.Fields(tt.args)...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("exportctl %s, %s = %v, want it to say %q", tt.args, tt.name, err, tt.want)
		}
		// exportctl runs once, under no service: a cause that blamed a
		// change "under the running service" misled its operator, who
		// may only have mistyped the setting.
		if err != nil && strings.Contains(err.Error(), "the running service") {
			t.Errorf("exportctl %s, %s = %v, which speaks of a running service", tt.args, tt.name, err)
		}
		if err != nil && strings.Contains(err.Error(), wrongPassword) {
			t.Errorf("exportctl %s, %s = %v, which holds the password", tt.args, tt.name, err)
		}
	}
}

// A command run on a database no migration has reached (a new one, or a
// DATABASE_URL naming another database of the cluster) says so, names the
// database, and says what to run: it printed only `relation "owners" does
// not exist (SQLSTATE 42P01)`.
func TestCommandsOnADatabaseNotMigratedSaySo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	const owner = "00000000-0000-0000-0000-000000000000"
	// Behind, with a table of a later migration's making missing (as
	// a later release's table would be): the versions are named.
	provider, db := migratedDownTo(t, dsn, 6)
	latest := provider.ListSources()[len(provider.ListSources())-1].Version
	if _, err := db.Exec("ALTER TABLE owners RENAME TO owners_aside"); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("the database is at schema version 6, this exportctl needs %d: run exportctl migrate", latest)
	if err := cli(t, dsn, "", nil, "owner", "list"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("exportctl owner list at version 6 = %v, want it to say %q", err, want)
	}
	if _, err := db.Exec("ALTER TABLE owners_aside RENAME TO owners"); err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	commands := [][]string{
		{"owner", "list"}, {"owner", "create", "--name", "x"}, {"platform", "list"},
		{"key", "create", "--owner", owner, "--scope", "export:read"}, {"key", "revoke", owner},
		{"key", "list", "--owner", owner}, {"items", "import", "--owner", owner, "--file", "-"},
		{"items", "seed", "--owner", owner, "--count", "1"}, {"items", "restamp", "--all-owners"},
	}
	for _, state := range []string{"migrated down to 0", "never migrated"} {
		if state == "never migrated" {
			if _, err := db.Exec("DROP TABLE goose_db_version"); err != nil {
				t.Fatal(err)
			}
		}
		for _, args := range commands {
			err := cli(t, dsn, "", nil, args...)
			if err == nil || !strings.Contains(err.Error(), "no migration has been applied to the database "+cfg.Database) ||
				!strings.Contains(err.Error(), "run exportctl migrate") {
				t.Errorf("%s: exportctl %v = %v, want it to say that no migration was applied to %s, and to run exportctl migrate",
					state, args, err, cfg.Database)
			}
		}
	}
	if err := cli(t, dsn, "", nil, "migrate"); err != nil {
		t.Fatalf("migrate = %v", err)
	}
	if err := cli(t, dsn, "", nil, "owner", "list"); err != nil {
		t.Errorf("owner list once migrated = %v", err)
	}
	// Up to date, a table missing is no migration's to make: no advice.
	if _, err := db.Exec("ALTER TABLE owners RENAME TO owners_aside"); err != nil {
		t.Fatal(err)
	}
	if err := cli(t, dsn, "", nil, "owner", "list"); err == nil || strings.Contains(err.Error(), "migrate") {
		t.Errorf("exportctl owner list on a database up to date, owners renamed = %v, want PostgreSQL's error without the advice to migrate", err)
	}
}

// pricedLines is n import lines, coin-0000 onwards, each at price.
func pricedLines(n int, price string) string {
	var b strings.Builder
	for i := range n {
		line := strings.Replace(goodLine, "coin-%d", fmt.Sprintf("coin-%04d", i), 1)
		fmt.Fprintln(&b, strings.Replace(line, `"price":10.5`, `"price":`+price, 1))
	}
	return b.String()
}

// importWaitingForALock starts an import of 3,000 items at price 2 for
// owner (which has coin-0000 to coin-1500 at price 1), whose second chunk
// waits for coin-1000, locked by the transaction it returns; the import's
// error arrives on the channel. cancel is the import's Ctrl-C.
func importWaitingForALock(t *testing.T, dsn, owner string) (locker pgx.Tx, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	if err := cli(t, dsn, pricedLines(1501, "1"), nil, "items", "import", "--owner", owner, "--file", "-"); err != nil {
		t.Fatal(err)
	}
	pool := testenv.Pool(t, dsn)
	locker = testenv.InTransaction(t, pool, `SELECT FROM export_items WHERE id = 'coin-1000' FOR UPDATE`)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	errs := make(chan error, 1)
	go func() {
		errs <- run(ctx, []string{"items", "import", "--owner", owner, "--file", "-"},
			func(string) string { return dsn }, strings.NewReader(pricedLines(3000, "2")), io.Discard, io.Discard)
	}()
	for waiting := 0; waiting == 0; {
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'exportctl' AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			t.Fatalf("import ended before its second chunk waited for the lock: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return locker, cancel, errs
}

// Ctrl-C while a chunk's statement runs: pgx closes the connection and
// sends PostgreSQL a cancel request, which rolls the chunk back unless it
// lands after the chunk's commit, before its reply was read. Which of the
// two happened is not known, so both counts are given: it said "stopped
// after writing 1000", one chunk low in the second case.
func TestItemsImportInterruptedInAChunkSaysBothCounts(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	_, cancel, done := importWaitingForALock(t, dsn, owner.ID)
	cancel()
	err := <-done
	if want := "stopped after writing 1000 of 3000 items (or 2000: the chunk under way may have committed)"; err == nil || !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), "run it again to complete it") {
		t.Errorf("import interrupted in its second chunk = %v, want it to say %q, and to run it again", err, want)
	}
}

// An owner deleted while its import runs (its items with it) stops the
// import with that said, and the chunks written before it counted: it
// said "nothing written" and that the owner did not exist.
func TestItemsImportOfAnOwnerDeletedMeanwhile(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	locker, _, done := importWaitingForALock(t, dsn, owner.ID)
	ctx := context.Background()
	for _, stmt := range []string{"DELETE FROM export_items WHERE owner_id = $1", "DELETE FROM owners WHERE id = $1"} {
		if _, err := locker.Exec(ctx, stmt, owner.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "stopped after writing 1000 of 3000 items") ||
		!strings.Contains(err.Error(), "the owner was deleted while the import ran") || strings.Contains(err.Error(), "run it again") {
		t.Errorf("import of an owner deleted meanwhile = %v, want it to count the 1000 items written, and to say the owner was deleted (not to run it again)", err)
	}
}

// A file with no items (empty, or blank lines only) is refused, exit 1:
// an operator who gave the wrong file was told "imported 0 items", exit
// 0. --allow-empty accepts one, for a script whose file may be empty.
func TestItemsImportOfNoItemsIsRefused(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	empty := filepath.Join(t.TempDir(), "items.jsonl")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, stdin, named string }{{empty, "", empty}, {"-", "\n  \n", "standard input"}} {
		err := cli(t, dsn, tc.stdin, nil, "items", "import", "--owner", owner.ID, "--file", tc.file)
		if want := tc.named + ": no items in it: nothing imported"; err == nil || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), "--allow-empty") {
			t.Errorf("import of no items from %s = %v, want it refused saying %q, and naming --allow-empty", tc.named, err, want)
		}
		var res map[string]int
		if err := cli(t, dsn, tc.stdin, &res, "items", "import", "--owner", owner.ID, "--file", tc.file, "--allow-empty"); err != nil || res["inserted"] != 0 {
			t.Errorf("import --allow-empty of no items from %s = %v, %v; want 0 inserted, no error", tc.named, res, err)
		}
	}
	cmd := runExportctl(dsn, "items", "import", "--owner", owner.ID, "--file", empty)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 1 || stdout.Len() != 0 || strings.Contains(stderr.String(), "usage:") {
		t.Errorf("exportctl items import of an empty file: exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout, no usage", code, stdout.String(), stderr.String())
	}
}

// A key whose row another transaction keeps locked (an operator's
// SELECT … FOR UPDATE left open) is waited for revokeLockWait, not
// without end, and the refusal names the session and what to do.
func TestKeyRevokeOfALockedKeyGivesUp(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	_, key := newReadKey(t, dsn)
	locker := testenv.InTransaction(t, testenv.Pool(t, dsn), "SELECT FROM api_keys WHERE id = $1 FOR UPDATE", key.ID)
	err := cli(t, dsn, "", nil, "key", "revoke", key.ID)
	if err == nil || !strings.Contains(err.Error(), "nothing revoked") || !strings.Contains(err.Error(), "in a transaction that long: pid ") ||
		!strings.Contains(err.Error(), "run key revoke again") {
		t.Errorf("key revoke of a locked key = %v, want it to give up, naming the session, nothing revoked, and to run it again", err)
	}
	if err := locker.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := cli(t, dsn, "", nil, "key", "revoke", key.ID); err != nil {
		t.Errorf("key revoke once the lock is gone = %v", err)
	}
}

// The revoke of a key whose secret could not be printed is bounded too: a
// lock on its row held elsewhere, it said nothing until that ended.
func TestKeyCreateGivesUpRevokingAnUnprintedKeyThatStaysLocked(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	pool := testenv.Pool(t, dsn)
	full := writerFunc(func(p []byte) (int, error) {
		id := strings.Fields(string(p))[1] // "key <id> (export:read)…"
		testenv.InTransaction(t, pool, "SELECT FROM api_keys WHERE id = $1 FOR UPDATE", id)
		return 0, errors.New("no space left on device")
	})
	err := run(context.Background(), []string{"key", "create", "--owner", owner.ID, "--scope", "export:read"},
		func(string) string { return dsn }, strings.NewReader(""), full, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "nor the key revoked") || !strings.Contains(err.Error(), "exportctl key revoke ") {
		t.Errorf("key create, its key unprinted and locked elsewhere = %v, want it to give up revoking, saying what to run", err)
	}
}

// A list with nothing in it says so, on stderr (stdout stays empty for a
// script reading it), where it printed nothing; --json prints [].
func TestEmptyListsSaySo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	for _, tc := range []struct {
		args []string
		note string
	}{
		{[]string{"key", "list", "--owner", owner.ID}, "owner " + owner.ID + " has no keys (key create makes one)\n"},
		{[]string{"platform", "list"}, "no platforms (platform create makes one)\n"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, func(string) string { return dsn }, strings.NewReader(""), &stdout, &stderr)
		if err != nil || stdout.Len() != 0 || stderr.String() != tc.note {
			t.Errorf("exportctl %v = %v, stdout %q, stderr %q; want nothing on stdout, %q on stderr", tc.args, err, stdout.String(), stderr.String(), tc.note)
		}
		stdout.Reset()
		stderr.Reset()
		err = run(context.Background(), append(tc.args, "--json"), func(string) string { return dsn }, strings.NewReader(""), &stdout, &stderr)
		if err != nil || stdout.String() != "[]\n" || stderr.Len() != 0 {
			t.Errorf("exportctl %v --json = %v, stdout %q, stderr %q; want [] and nothing on stderr", tc.args, err, stdout.String(), stderr.String())
		}
	}
	if _, err := testenv.Pool(t, dsn).Exec(context.Background(), "DELETE FROM owners"); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"owner", "list"}, func(string) string { return dsn }, strings.NewReader(""), &stdout, &stderr)
	if want := "no owners (owner create makes one)\n"; err != nil || stdout.Len() != 0 || stderr.String() != want {
		t.Errorf("exportctl owner list of none = %v, stdout %q, stderr %q; want %q on stderr", err, stdout.String(), stderr.String(), want)
	}
}

// A column missing (42703), as a later migration's column would be in a
// database behind this build, is told as a table missing is: the
// versions, and to run exportctl migrate.
func TestCommandOnADatabaseBehindMissingAColumnSaysSo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	provider, db := migratedDownTo(t, dsn, 6)
	latest := provider.ListSources()[len(provider.ListSources())-1].Version
	if _, err := db.Exec("ALTER TABLE owners RENAME COLUMN created_at TO created_at_aside"); err != nil {
		t.Fatal(err)
	}
	err := cli(t, dsn, "", nil, "owner", "list")
	want := fmt.Sprintf("the database is at schema version 6, this exportctl needs %d: run exportctl migrate", latest)
	if err == nil || !strings.Contains(err.Error(), "42703") || !strings.Contains(err.Error(), want) {
		t.Errorf("exportctl owner list, a column missing at version 6 = %v, want PostgreSQL's 42703 and %q", err, want)
	}
}

// A gzip-compressed file is named as such: "line 1: the line must be a
// JSON object" sent the operator to read a file that looks fine once
// unpacked.
func TestItemsImportOfAGzipFileSaysSo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	var packed bytes.Buffer
	zw := gzip.NewWriter(&packed)
	fmt.Fprintln(zw, strings.Replace(goodLine, "%d", "1", 1))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	err := cli(t, dsn, packed.String(), nil, "items", "import", "--owner", owner.ID, "--file", "-")
	if want := "standard input: nothing imported: it is gzip-compressed"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("import of a gzip file = %v, want it to say %q", err, want)
	}
}

// A folder given as the file is named as such: it was refused as
// "catalog: read line 1: read DIR: is a directory".
func TestItemsImportOfAFolderSaysSo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	folder := t.TempDir()
	err := cli(t, dsn, "", nil, "items", "import", "--owner", owner.ID, "--file", folder)
	if want := folder + ": nothing imported: it is a folder"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("import of a folder = %v, want %q", err, want)
	}
}

// A folder given as standard input ("--file - < FOLDER", which the shell
// opens) is named as such too: it was refused as "catalog: read line 1:
// read /dev/stdin: is a directory".
func TestItemsImportOfAFolderOnStandardInputSaysSo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	folder, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer folder.Close()
	err = run(context.Background(), []string{"items", "import", "--owner", owner.ID, "--file", "-"},
		func(string) string { return dsn }, folder, io.Discard, io.Discard)
	if want := "standard input: nothing imported: it is a folder"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("import of a folder on standard input = %v, want %q", err, want)
	}
}

// Ctrl-C during items seed says that nothing was seeded (one
// transaction): it said "seed: catalog: seed copy: read unix …: use of
// closed network connection".
func TestItemsSeedInterruptedSaysNothingSeeded(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	pool := testenv.Pool(t, dsn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"items", "seed", "--owner", owner.ID, "--count", "2000000"},
			func(string) string { return dsn }, strings.NewReader(""), io.Discard, io.Discard)
	}()
	for copying := 0; copying == 0; {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'exportctl' AND query LIKE 'copy%'`).Scan(&copying); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("seed ended before its COPY was seen: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	err := <-done
	if want := "seed: interrupted (context canceled): nothing seeded"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("items seed interrupted = %v, want it to say %q", err, want)
	}
	if n := countItems(t, dsn, owner.ID); n != 0 {
		t.Errorf("owner has %d items after an interrupted seed, want 0", n)
	}
}

// A list whose lines could not be written (a full disk under
// "> owners.txt") fails naming the write's error, as every other
// command's output does (emit): it exited 0 with the list missing.
func TestListsFailWhenTheirLinesCannotBeWritten(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner, _ := newReadKey(t, dsn)
	if err := cli(t, dsn, "", nil, "platform", "create", "--id", "market-1"); err != nil {
		t.Fatal(err)
	}
	full := writerFunc(func([]byte) (int, error) { return 0, errors.New("no space left on device") })
	for _, args := range [][]string{{"owner", "list"}, {"platform", "list"}, {"key", "list", "--owner", owner.ID}} {
		err := run(context.Background(), args, func(string) string { return dsn }, strings.NewReader(""), full, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "no space left on device") {
			t.Errorf("exportctl %v printing to a full disk = %v, want the write's error", args, err)
		}
	}
}

// A key pasted where a name or a platform id belongs (the wrong field of a
// form, a clipboard still holding it) is refused, not stored: names and
// platform ids are kept and printed in the clear (owner list, key list, a
// platform id in every sale's answer and log line), and keys are stored
// only as their hash. Its tag off or its checksum cut short, it is the
// secret all the same.
func TestKeysAreNotStoredAsNamesOrPlatformIDs(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner, key := newReadKey(t, dsn)
	secret := key.Key[strings.IndexByte(key.Key, '_')+1:]
	for _, args := range [][]string{
		{"owner", "create", "--name", key.Key},
		{"owner", "create", "--name", "Coins " + secret},
		{"platform", "create", "--id", key.Key[:len(key.Key)-2]},
		{"platform", "create", "--id", "market", "--name", key.Key},
		{"key", "create", "--owner", owner.ID, "--scope", "export:read", "--name", "old " + key.Key},
	} {
		err := cli(t, dsn, "", nil, args...)
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "holds an API key") {
			t.Errorf("exportctl %s = %v, want a usage error saying it holds an API key", redactKeys(strings.Join(args, " ")), err)
		}
	}
	var stored string
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(name, ' '), '') FROM (SELECT name FROM owners UNION ALL SELECT id || ' ' || name FROM platforms UNION ALL SELECT name FROM api_keys) t`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if apikey.ContainsKeySecret(stored) {
		t.Errorf("owners, platforms or api_keys hold the key in the clear: %s", redactKeys(stored))
	}
}
