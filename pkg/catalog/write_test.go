package catalog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// newOwner inserts an owner and returns its id.
func newOwner(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `INSERT INTO owners (name) VALUES ('test') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatalf("insert owner: %v", err)
	}
	return id
}

// ownerWithItems inserts an owner, imports lines for it and returns its id.
func ownerWithItems(t *testing.T, pool *pgxpool.Pool, lines ...string) string {
	t.Helper()
	owner := newOwner(t, pool)
	if _, err := catalog.Import(context.Background(), pool, owner, mustParse(t, lines...)); err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	return owner
}

func mustParse(t *testing.T, lines ...string) []catalog.Item {
	t.Helper()
	items, err := catalog.ParseJSONL(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("ParseJSONL() error = %v", err)
	}
	return items
}

type storedItem struct {
	Status    string
	Listed    bool
	Sold      bool
	UpdatedAt time.Time
	DocENG    string
	DocRUS    string
}

func stored(t *testing.T, pool *pgxpool.Pool, owner, id string) storedItem {
	t.Helper()
	var s storedItem
	err := pool.QueryRow(context.Background(), `SELECT status, listed_active, sold, updated_at, doc_eng, doc_rus
		FROM export_items WHERE owner_id = $1 AND id = $2`, owner, id).
		Scan(&s.Status, &s.Listed, &s.Sold, &s.UpdatedAt, &s.DocENG, &s.DocRUS)
	if err != nil {
		t.Fatalf("select %s: %v", id, err)
	}
	return s
}

const (
	lineA  = `{"id":"a","status":"active","currency":"EUR","price":12.5,"texts":{"ENG":{"title":"Thaler","description":"Silver"}}}`
	lineA2 = `{"id":"a","status":"active","currency":"EUR","price":13,"texts":{"ENG":{"title":"Thaler","description":"Silver"}}}`
	lineB  = `{"id":"b","status":"inactive","currency":"UAH","texts":{"ENG":{"title":"Hryvnia"},"RUS":{"title":"Гривна"}}}`
)

func TestImportUpsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)

	got, err := catalog.Import(ctx, pool, owner, mustParse(t, lineA, lineB))
	if err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	if diff := cmp.Diff(catalog.ImportResult{Inserted: 2}, got); diff != "" {
		t.Errorf("Import(new) result (-want +got):\n%s", diff)
	}
	a1, b1 := stored(t, pool, owner, "a"), stored(t, pool, owner, "b")

	// The same file again changes nothing, not even updated_at.
	got, err = catalog.Import(ctx, pool, owner, mustParse(t, lineB, lineA))
	if err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	if diff := cmp.Diff(catalog.ImportResult{Unchanged: 2}, got); diff != "" {
		t.Errorf("Import(same) result (-want +got):\n%s", diff)
	}
	if a := stored(t, pool, owner, "a"); !a.UpdatedAt.Equal(a1.UpdatedAt) {
		t.Errorf("unchanged import moved updated_at of a: %v, want %v", a.UpdatedAt, a1.UpdatedAt)
	}

	// A changed price moves updated_at past every earlier stamp.
	got, err = catalog.Import(ctx, pool, owner, mustParse(t, lineA2, lineB))
	if err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	if diff := cmp.Diff(catalog.ImportResult{Updated: 1, Unchanged: 1}, got); diff != "" {
		t.Errorf("Import(changed) result (-want +got):\n%s", diff)
	}
	a2 := stored(t, pool, owner, "a")
	if !a2.UpdatedAt.After(a1.UpdatedAt) || !a2.UpdatedAt.After(b1.UpdatedAt) {
		t.Errorf("changed item updated_at = %v, want after %v and %v", a2.UpdatedAt, a1.UpdatedAt, b1.UpdatedAt)
	}
	if !strings.Contains(a2.DocENG, `"price":13,`) {
		t.Errorf("doc_eng after update = %s, want price 13", a2.DocENG)
	}
	// RUS falls back to ENG for a, and is its own for b.
	if !strings.Contains(a2.DocRUS, `"title":"Thaler"`) || !strings.Contains(b1.DocRUS, `"title":"Гривна"`) {
		t.Errorf("doc_rus = %s / %s, want ENG fallback for a and the RUS title for b", a2.DocRUS, b1.DocRUS)
	}
}

// An import leaves the rows of unchanged items alone: not even locked.
// ON CONFLICT DO UPDATE locks every row it meets, its WHERE false or not,
// and a lock sets the row's xmax, writes a WAL record and dirties its page
// (after a checkpoint, a full-page image: a soak's re-import of a 20,000-item
// catalog with 15% changed wrote 33 MB of WAL for the 85% unchanged), so
// each unchanged row must be left out before the INSERT.
func TestImportLocksNoUnchangedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerWithItems(t, pool, lineA, lineB)

	got, err := catalog.Import(ctx, pool, owner, mustParse(t, lineA2, lineB))
	if err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	if diff := cmp.Diff(catalog.ImportResult{Updated: 1, Unchanged: 1}, got); diff != "" {
		t.Errorf("Import() result (-want +got):\n%s", diff)
	}
	// A row version's xmax is 0 until a transaction deletes, updates or
	// locks it. (a's new version carries the lock its update took.)
	var xmax string
	if err := pool.QueryRow(ctx, `SELECT xmax::text FROM export_items WHERE owner_id = $1 AND id = 'b'`, owner).Scan(&xmax); err != nil {
		t.Fatalf("select b: %v", err)
	}
	if xmax != "0" {
		t.Errorf("the unchanged item's row has xmax %s, want 0: the import locked it", xmax)
	}
}

// A large import is written and committed ImportChunk items at a time (so
// none of them waits long between its stamp and its commit, nor holds its
// row lock for the whole import), and counts across chunks like one.
func TestImportCommitsChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	n := 2*catalog.ImportChunk + catalog.ImportChunk/2
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"c%05d","status":"active","currency":"EUR","price":%d,"texts":{"ENG":{"title":"Coin"}}}`, i, i)
	}
	got, err := catalog.Import(ctx, pool, owner, mustParse(t, lines...))
	if err != nil {
		t.Fatalf("Import(%d items) error = %v", n, err)
	}
	if diff := cmp.Diff(catalog.ImportResult{Inserted: n}, got); diff != "" {
		t.Errorf("Import(new) result (-want +got):\n%s", diff)
	}
	var transactions, items int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text), count(*) FROM export_items WHERE owner_id = $1`, owner).
		Scan(&transactions, &items); err != nil {
		t.Fatal(err)
	}
	if want := (n + catalog.ImportChunk - 1) / catalog.ImportChunk; transactions != want || items != n {
		t.Errorf("%d items written by %d transactions, want %d items by %d (one per chunk)", items, transactions, n, want)
	}
	// Changes in every chunk, counted once each.
	for _, i := range []int{0, catalog.ImportChunk + 1, n - 1} {
		lines[i] = strings.Replace(lines[i], `"price":`, `"price":1`, 1)
	}
	if got, err = catalog.Import(ctx, pool, owner, mustParse(t, lines...)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(catalog.ImportResult{Updated: 3, Unchanged: n - 3}, got); diff != "" {
		t.Errorf("Import(3 changed) result (-want +got):\n%s", diff)
	}
}

func TestImportNeverUnsells(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerWithItems(t, pool, lineA)
	if _, err := pool.Exec(ctx, `UPDATE export_items SET sold = true, updated_at = clock_timestamp() WHERE owner_id = $1 AND id = 'a'`, owner); err != nil {
		t.Fatalf("sell: %v", err)
	}
	if _, err := catalog.Import(ctx, pool, owner, mustParse(t, lineA2)); err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	got := stored(t, pool, owner, "a")
	if got.Status != "inactive" || !got.Sold || !got.Listed {
		t.Errorf("after re-import of a sold item: status %s sold %v listed %v, want inactive, sold, listed", got.Status, got.Sold, got.Listed)
	}
}

// A changed item's updated_at never moves backwards, even when the clock
// reads earlier than its last stamp (it stepped back).
func TestImportNeverMovesUpdatedAtBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerWithItems(t, pool, lineA)
	var ahead time.Time
	if err := pool.QueryRow(ctx, `UPDATE export_items SET updated_at = now() + interval '1 hour'
	    WHERE owner_id = $1 AND id = 'a' RETURNING updated_at`, owner).Scan(&ahead); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Import(ctx, pool, owner, mustParse(t, lineA2)); err != nil {
		t.Fatalf("Import() error = %v", err)
	}
	if got := stored(t, pool, owner, "a"); !got.UpdatedAt.After(ahead) {
		t.Errorf("re-imported item updated_at = %v, want after its last stamp %v", got.UpdatedAt, ahead)
	}
}

func TestImportErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	items := mustParse(t, lineA)
	if _, err := catalog.Import(ctx, pool, "not-a-uuid", items); err == nil {
		t.Errorf("Import(owner not-a-uuid) error = nil, want an error")
	}
	_, err := catalog.Import(ctx, pool, "5f0c7d52-8a3c-4c61-9a55-2b8f1b0c9d10", items)
	if !errors.Is(err, catalog.ErrOwnerNotFound) {
		t.Errorf("Import(unknown owner) error = %v, want ErrOwnerNotFound", err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM export_items`).Scan(&n)
	if n != 0 {
		t.Errorf("rows after failed imports = %d, want 0", n)
	}
}

// Import refuses items that did not come through ParseJSONL when an id
// could not be addressed by a URL, and writes none of the batch.
func TestImportRefusesUnaddressableIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	for _, id := range []string{"x/y", "..", `x\y`, "", "a\x00b"} {
		items := mustParse(t, lineA, lineB)
		items[1].ID = id
		_, err := catalog.Import(ctx, pool, owner, items)
		if err == nil || !strings.Contains(err.Error(), "item 2") {
			t.Errorf("Import(item 2 with id %q) error = %v, want an error naming item 2", id, err)
		}
	}
	// An id holding an API key is named by its place alone: the error may
	// be logged, and the key would be in it.
	key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	items := mustParse(t, lineA, lineB)
	items[1].ID = "coin-" + key
	if _, err := catalog.Import(ctx, pool, owner, items); err == nil || !strings.Contains(err.Error(), "item 2") ||
		strings.Contains(err.Error(), key) {
		t.Errorf("Import(item 2 with an id holding a key) error = %v, want an error naming item 2, not its id", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM export_items`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("rows after refused imports = %d, want 0", n)
	}
}

func TestSeed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	const count = 3000
	n, err := catalog.Seed(ctx, pool, owner, count, 7)
	if err != nil || n != count {
		t.Fatalf("Seed(%d) = %d, %v, want %d, nil", count, n, err, count)
	}
	rows, err := pool.Query(ctx, `SELECT id, status, updated_at, doc_eng, doc_rus, doc_ukr FROM export_items WHERE owner_id = $1`, owner)
	if err != nil {
		t.Fatalf("select: %v", err)
	}
	defer rows.Close()
	types := map[string]int{}
	inactive := 0
	for rows.Next() {
		var id, status string
		var updated time.Time
		var docs [3]string
		if err := rows.Scan(&id, &status, &updated, &docs[0], &docs[1], &docs[2]); err != nil {
			t.Fatalf("scan: %v", err)
		}
		if err := catalog.ValidItemID(id); err != nil {
			t.Errorf("seeded id %q: ValidItemID = %v, want nil", id, err)
		}
		if status == "inactive" {
			inactive++
		}
		for _, doc := range docs {
			item := checkExportItem(t, catalog.Compose(nil, status, updated, []byte(doc)))
			for _, img := range item.Images {
				types[img.Type]++
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("rows: %v", err)
	}
	for _, typ := range catalog.ImageTypes {
		if types[typ] == 0 {
			t.Errorf("seeded images of type %s = 0, want some", typ)
		}
	}
	if inactive == 0 || inactive > count/2 {
		t.Errorf("inactive seeded items = %d of %d, want some but a minority", inactive, count)
	}
	// A second seed of another seed value adds, never collides.
	if n, err := catalog.Seed(ctx, pool, owner, 10, 8); err != nil || n != 10 {
		t.Errorf("Seed(10, seed 8) = %d, %v, want 10, nil", n, err)
	}
}

// exportItem is spec 2.2 with every required field as a pointer or raw value,
// so a missing field is seen.
type exportItem struct {
	ID              *string          `json:"id"`
	CoinID          json.RawMessage  `json:"coin_id"`
	Status          *string          `json:"status"`
	Title           *string          `json:"title"`
	Description     *string          `json:"description"`
	Price           json.RawMessage  `json:"price"`
	Currency        *string          `json:"currency"`
	StockQuantity   *int             `json:"stock_quantity"`
	Category        json.RawMessage  `json:"category"`
	Characteristics *json.RawMessage `json:"characteristics"`
	Images          []catalog.Image  `json:"images"`
	UpdatedAt       *string          `json:"updated_at"`
}

// checkExportItem decodes doc strictly and checks it against spec 2.2/2.3.
func checkExportItem(t *testing.T, doc []byte) exportItem {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(doc)))
	dec.DisallowUnknownFields()
	var it exportItem
	if err := dec.Decode(&it); err != nil {
		t.Fatalf("decode %s: %v", doc, err)
	}
	switch {
	case it.ID == nil || *it.ID == "", it.Status == nil, it.Title == nil || *it.Title == "", it.Currency == nil,
		it.StockQuantity == nil, it.Characteristics == nil, it.Images == nil, it.UpdatedAt == nil,
		it.CoinID == nil, it.Price == nil, it.Category == nil:
		t.Fatalf("item %s misses a field", doc)
	case (*it.Status == "active") != (*it.StockQuantity == 1) || (*it.Status != "active" && *it.Status != "inactive"):
		t.Fatalf("item %s: status/stock mismatch", doc)
	case !strings.HasPrefix(string(*it.Characteristics), "{"):
		t.Fatalf("item %s: characteristics not an object", doc)
	}
	if ts, err := time.Parse(time.RFC3339Nano, *it.UpdatedAt); err != nil || !strings.HasSuffix(*it.UpdatedAt, "Z") || ts.Location() != time.UTC {
		t.Fatalf("item %s: updated_at not RFC 3339 UTC", doc)
	}
	for i, img := range it.Images {
		if !strings.HasPrefix(img.URL, "https://") || img.ID == "" || (i > 0 && img.Position <= it.Images[i-1].Position) {
			t.Fatalf("item %s: bad image %d", doc, i)
		}
	}
	return it
}

// ImportJSONL streams a file into the catalog: every item is written, and
// a bad line anywhere (the last one here, after 2,500 good ones: more than
// two chunks) writes nothing and names its line, as ParseJSONL would.
func TestImportJSONLWritesAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	var file strings.Builder
	for i := range 2500 {
		fmt.Fprintf(&file, `{"id":"c%05d","status":"active","currency":"EUR","price":%d,"texts":{"ENG":{"title":"Coin"}}}`+"\n", i, i)
	}
	good := file.String()
	count := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM export_items WHERE owner_id = $1`, owner).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for name, tail := range map[string]string{
		"bad line":     "\n" + `{"id":"late","status":"sold"}` + "\n",
		"repeated id":  `{"id":"c00007","status":"active","currency":"EUR","texts":{"ENG":{"title":"Coin"}}}`,
		"no JSON line": "not json",
	} {
		_, err := catalog.ImportJSONL(ctx, pool, owner, strings.NewReader(good+tail))
		var bad *catalog.LineError
		if !errors.As(err, &bad) || bad.Line < 2501 {
			t.Errorf("ImportJSONL(%s at the end) error = %v, want a *LineError after line 2,500", name, err)
		}
		if n := count(); n != 0 {
			t.Fatalf("ImportJSONL(%s at the end) wrote %d items, want none", name, n)
		}
	}
	res, err := catalog.ImportJSONL(ctx, pool, owner, strings.NewReader(good))
	if err != nil || res != (catalog.ImportResult{Inserted: 2500}) || count() != 2500 {
		t.Fatalf("ImportJSONL(2,500 items) = %+v, %v, %d stored; want 2,500 inserted", res, err, count())
	}
	if got := stored(t, pool, owner, "c02499").DocENG; !strings.Contains(got, `"price":2499,`) {
		t.Errorf("last item's document = %s, want price 2499", got)
	}
	res, err = catalog.ImportJSONL(ctx, pool, owner, strings.NewReader(good))
	if err != nil || res != (catalog.ImportResult{Unchanged: 2500}) {
		t.Errorf("ImportJSONL(same file again) = %+v, %v; want 2,500 unchanged", res, err)
	}
}

// What the parser takes at its edges, PostgreSQL stores: a number with
// 16383 digits after the point (numeric's most; one more failed the whole
// import's COPY, naming no line), 64 levels of nesting, and the document
// keeps the numbers as written.
func TestImportJSONLStoresTheEdgesTheParserTakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	chars := `{"a":1e-16383,"b":1.5e-16382,"c":0.` + strings.Repeat("0", 16382) + `1,"d":0e1073741822,"e":` +
		strings.Repeat("[", 62) + strings.Repeat("]", 62) + `}`
	line := `{"id":"edge","status":"active","currency":"EUR","characteristics":` + chars +
		`,"category":{"n":1e-16383},"texts":{"ENG":{"title":"T"},"RUS":null}}`
	if _, err := catalog.ImportJSONL(ctx, pool, owner, strings.NewReader(line)); err != nil {
		t.Fatalf("ImportJSONL(edge item) error = %v", err)
	}
	doc := stored(t, pool, owner, "edge").DocRUS
	if !strings.Contains(doc, `"a":1e-16383,"b":1.5e-16382,`) || !strings.Contains(doc, `"title":"T"`) {
		t.Errorf("RUS document = %.200s…, want the numbers as written and ENG's title", doc)
	}
	for _, bad := range []string{`{"x":1e-16384}`, `{"x":0e-20000}`, `{"x":0e1073741823}`} {
		_, err := catalog.ImportJSONL(ctx, pool, owner, strings.NewReader(
			`{"id":"late","status":"active","currency":"EUR","characteristics":`+bad+`,"texts":{"ENG":{"title":"T"}}}`))
		var le *catalog.LineError
		if !errors.As(err, &le) || le.Line != 1 {
			t.Errorf("ImportJSONL(characteristics %s) error = %v, want a *LineError on line 1", bad, err)
		}
	}
}

// blockingReader serves data, then, asked for more, closes asked and
// blocks until release is closed, then ends the file.
type blockingReader struct {
	data           []byte
	asked, release chan struct{}
}

func (r *blockingReader) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	select {
	case <-r.asked:
	default:
		close(r.asked)
	}
	<-r.release
	return 0, io.EOF
}

// An import whose file is slow to come (a pipe from a slow producer:
// exportctl items import --file -) holds no transaction open while it
// waits for its next lines: a COPY fed as the file was read held its
// snapshot all the while, and no VACUUM of the database removed a row
// version that died meanwhile. The staging's session is idle once a batch
// is copied, whatever comes next.
func TestImportJSONLHoldsNoTransactionWhileItWaitsForTheFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	pool := testenv.Pool(t, dsn)
	owner := newOwner(t, pool)
	var file strings.Builder
	for i := range catalog.StageBatch + 1 {
		fmt.Fprintf(&file, `{"id":"c%05d","status":"active","currency":"EUR","price":%d,"texts":{"ENG":{"title":"Coin"}}}`+"\n", i, i)
	}
	r := &blockingReader{data: []byte(file.String()), asked: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := catalog.ImportJSONL(ctx, pool, owner, r)
		done <- err
	}()
	<-r.asked // the import waits for the rest of the file
	// Its session, found by the COPY it has sent, or the COMMIT of that
	// COPY's transaction (copyBatch): a batch's, which ends, or one fed by
	// the file, which lasts as long as the file is awaited.
	check := testenv.Pool(t, dsn)
	var state string
	var inTransaction bool
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := check.QueryRow(ctx, `SELECT state, xact_start IS NOT NULL FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND (query ILIKE 'copy%' OR query ILIKE 'commit')`).Scan(&state, &inTransaction)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("the import's session: %v", err)
		}
		if (err == nil && state == "idle" && !inTransaction) || time.Now().After(deadline) {
			break
		}
	}
	close(r.release)
	if state != "idle" || inTransaction {
		t.Errorf("10 s into the import's wait for its file, its session is %q (in a transaction: %t), want idle outside one", state, inTransaction)
	}
	if err := <-done; err != nil {
		t.Fatalf("ImportJSONL() error = %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM export_items WHERE owner_id = $1`, owner).Scan(&n); err != nil || n != catalog.StageBatch+1 {
		t.Errorf("%d items stored (%v), want %d", n, err, catalog.StageBatch+1)
	}
}

// An import's rows travel to its staging table in COPY's text format,
// which reads a backslash, a tab, a newline and a carriage return as its
// own: every column holds them back as imported, and each document as
// Render makes it (its JSON escapes are backslashes too).
func TestImportKeepsWhatCOPYsTextFormatEscapes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	// JSON text: back\slash, a tab, a newline, a return, \N, \., \\t, "quoted".
	const slashes = `back\\slash, \\N, \\., \\\\t, \"quoted\", ünï ☃` // a title's: no control characters
	const tricky = `back\\slash, tab\t, newline\n, return\r, \\N, \\., \\\\t, \"quoted\", ünï ☃`
	line := `{"id":"copy-edge","coin_id":"km\\N\\t","status":"active","price":0.0001,"currency":"EUR",` +
		`"category":{"id":"c\\d","name":"` + tricky + `"},"characteristics":{"note":"` + tricky + `"},` +
		`"images":[{"id":"i\\1","url":"https://cdn.example.com/a%5Cb.jpg","position":1,"type":"obverse"}],` +
		`"texts":{"ENG":{"title":"` + slashes + `","description":"` + tricky + `"},"RUS":{"title":"\\N"}}}`
	items := mustParse(t, line)
	if _, err := catalog.ImportJSONL(ctx, pool, owner, strings.NewReader(line)); err != nil {
		t.Fatal(err)
	}
	want := items[0]
	texts, images := mustMarshal(t, want.Texts), mustMarshal(t, want.Images)
	var coinID, price, docENG, docRUS, docUKR string
	var jsonSame bool
	err := pool.QueryRow(ctx, `SELECT coin_id, price::text, doc_eng, doc_rus, doc_ukr,
		category = $3::jsonb AND characteristics = $4::jsonb AND images = $5::jsonb AND texts = $6::jsonb
		FROM export_items WHERE owner_id = $1 AND id = $2`, owner, want.ID,
		string(want.Category), string(want.Characteristics), images, texts).
		Scan(&coinID, &price, &docENG, &docRUS, &docUKR, &jsonSame)
	if err != nil {
		t.Fatal(err)
	}
	if coinID != *want.CoinID || price != "0.0001" || !jsonSame {
		t.Errorf("stored coin_id %q, price %s, JSON columns as imported: %v; want %q, 0.0001, true", coinID, price, jsonSame, *want.CoinID)
	}
	for lang, got := range map[string]string{"ENG": docENG, "RUS": docRUS, "UKR": docUKR} {
		if doc := string(catalog.Render(&want, lang)); got != doc {
			t.Errorf("stored %s document:\n%s\nwant:\n%s", lang, got, doc)
		}
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
