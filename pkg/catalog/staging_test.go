package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

// Behind a pooler in transaction mode another client's transactions run in
// an import's session between its own: another import's staging must not
// be what this one writes. With one staging table name for every import,
// the second import's staging replaced the first's, and the first owner was
// given the second owner's items.
func TestImportWritesOnlyItsOwnStaging(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owners := []pgtype.UUID{ownerIn(t, pool), ownerIn(t, pool)}
	conn := acquire(t, pool)
	runs := make([]*stagingRun, 2)
	for i, prefix := range []string{"mine", "theirs"} {
		var items []Item
		for n := range 3 {
			items = append(items, itemFor(t, fmt.Sprintf("%s-%d", prefix, n)))
		}
		runs[i] = stageIn(t, conn, owners[i], items)
	}
	if _, err := writeStaged(ctx, conn, owners[0], runs[0], 3); err != nil {
		t.Fatalf("writeStaged: %v", err)
	}
	if ids, want := itemIDs(t, pool, owners[0]), []string{"mine-0", "mine-1", "mine-2"}; !slices.Equal(ids, want) {
		t.Errorf("the owner's items are %q, want %q: it was given another import's items", ids, want)
	}
}

// Through PgBouncer in transaction mode, imports at once each complete,
// each owner given exactly its own items, and nothing is left behind: no
// staging table, no run, no setting on a server session. With TEMP
// staging tables every import stopped ("the import's staging table is not
// in this session") and left its table in the session that made it.
func TestImportsAtOnceThroughATransactionPoolComplete(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	pooled := testenv.Pool(t, testenv.PgBouncer(t, dsn, "transaction")+" default_query_exec_mode=exec")
	direct := testenv.Pool(t, dsn)
	var serverDefault string // pglz, unless the server's configuration says otherwise
	if err := direct.QueryRow(ctx, `SHOW default_toast_compression`).Scan(&serverDefault); err != nil {
		t.Fatal(err)
	}
	const imports, perImport = 4, 2500
	owners, files := make([]pgtype.UUID, imports), make([][]Item, imports)
	for i := range owners {
		owners[i] = ownerIn(t, direct)
		for n := range perImport {
			files[i] = append(files[i], itemFor(t, fmt.Sprintf("o%d-%05d", i, n)))
		}
	}
	var g errgroup.Group
	for i, owner := range owners {
		g.Go(func() error {
			res, err := Import(ctx, pooled, owner.String(), files[i])
			if err == nil && res.Inserted != perImport {
				err = fmt.Errorf("%+v, want %d inserted", res, perImport)
			}
			if err != nil {
				return fmt.Errorf("import %d: %w", i, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for i, owner := range owners {
		ids := itemIDs(t, direct, owner)
		if len(ids) != perImport || ids[0] != fmt.Sprintf("o%d-00000", i) || ids[perImport-1] != fmt.Sprintf("o%d-%05d", i, perImport-1) {
			t.Errorf("owner %d holds %d items (%q…), want its own %d", i, len(ids), ids[:min(len(ids), 2)], perImport)
		}
	}
	assertNoStagingLeft(t, direct)
	for range 4 { // the pool's two server sessions, whichever answers
		var compression string
		if err := pooled.QueryRow(ctx, `SHOW default_toast_compression`).Scan(&compression); err != nil || compression != serverDefault {
			t.Errorf("a server session's default_toast_compression = %q (%v), want the server's %q: an import set it for others",
				compression, err, serverDefault)
		}
	}
}

// Through PgBouncer in transaction mode (1.18), an import cut short in the
// middle of a COPY (a Ctrl-C) leaves the pool serving. A COPY alone, out
// of a transaction, left the server connection it ran on linked to the
// next client, its answer never sent: live, 4 of 20 Ctrl-Cs under load
// took a server connection of a pool of 2 each, and every client waited;
// this test failed 4 runs of 4 so (a probe's query timed out, PgBouncer
// refused connections, a staging table was left).
func TestAnImportCutInItsCopyLeavesATransactionPoolServing(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	pooled := testenv.Pool(t, testenv.PgBouncer(t, dsn, "transaction")+" default_query_exec_mode=exec")
	direct := testenv.Pool(t, dsn)
	owner := ownerIn(t, direct)
	var items []Item
	for n := range 10000 {
		items = append(items, itemWithText(t, fmt.Sprintf("cut-%05d", n), strings.Repeat("Lorem ipsum ", 250)))
	}
	load, stopLoad := context.WithCancel(ctx)
	var clients errgroup.Group
	for range 4 { // other clients of the pool, which a wedged server connection's client is among
		clients.Go(func() error {
			for load.Err() == nil {
				_, _ = pooled.Exec(load, `SELECT pg_sleep(0.01)`)
			}
			return nil
		})
	}
	defer func() { stopLoad(); _ = clients.Wait() }()
	for cut := range 20 {
		importCtx, cancel := context.WithCancel(ctx)
		imported := make(chan error, 1)
		go func() {
			_, err := Import(importCtx, pooled, owner.String(), items)
			imported <- err
		}()
		testenv.WaitUntilTrue(t, direct, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'copy%' AND state = 'active')`)
		time.Sleep(time.Duration(rand.Int64N(int64(300 * time.Millisecond))))
		cancel()
		<-imported
		probe, cancelProbe := context.WithTimeout(ctx, 5*time.Second)
		_, err := pooled.Exec(probe, `SELECT 1`)
		cancelProbe()
		if err != nil {
			t.Fatalf("after Ctrl-C %d in a COPY, the pool answers no query: %v", cut+1, err)
		}
	}
	stopLoad()
	_ = clients.Wait()
	assertNoStagingLeft(t, direct)
}

// An import drops the tables of runs not seen for stagingStaleAfter (a
// killed exportctl's), and leaves those of runs still seen.
func TestAnImportDropsTheStagingOfStoppedRuns(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	conn := acquire(t, pool)
	stopped := stageIn(t, conn, owner, []Item{itemFor(t, "left-1")})
	running := stageIn(t, conn, owner, []Item{itemFor(t, "left-2")})
	if _, err := pool.Exec(ctx, `UPDATE import_staging.runs SET seen_at = now() - make_interval(secs => $2) WHERE staging = $1`,
		stopped.name, (stagingStaleAfter + time.Second).Seconds()); err != nil {
		t.Fatal(err)
	}
	if _, err := Import(ctx, pool, owner.String(), []Item{itemFor(t, "new-1")}); err != nil {
		t.Fatal(err)
	}
	if got, want := stagingTables(t, pool), []string{running.name, "runs"}; !slices.Equal(got, want) {
		t.Errorf("import_staging holds %q, want %q: the stopped run's table dropped, the running one's kept", got, want)
	}
	if got := registeredRuns(t, pool); !slices.Equal(got, []string{running.name}) {
		t.Errorf("runs registered: %q, want only %q", got, running.name)
	}
}

// A stopped run's table that cannot be dropped now (a pg_dump holds a lock
// on it, as long as it runs) is left for a later import: the import goes
// on. The drop waited for the lock with no bound, and the import with it.
func TestAnImportGoesOnPastAStoppedRunsTableItCannotDrop(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	stopped := stageIn(t, acquire(t, pool), owner, []Item{itemFor(t, "left-1")})
	age(t, pool, stopped)
	dump := testenv.InTransaction(t, pool, "LOCK TABLE "+stopped.table()+" IN ACCESS SHARE MODE")
	importCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := Import(importCtx, pool, owner.String(), []Item{itemFor(t, "new-1")}); err != nil {
		t.Fatalf("Import while a stopped run's table is locked: %v", err)
	}
	if got := registeredRuns(t, pool); !slices.Equal(got, []string{stopped.name}) {
		t.Errorf("runs registered: %q, want the locked one, %q, kept for a later import", got, stopped.name)
	}
	if err := dump.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Import(ctx, pool, owner.String(), []Item{itemFor(t, "new-2")}); err != nil {
		t.Fatal(err)
	}
	assertNoStagingLeft(t, pool)
}

// A run read as stopped but marked seen before its table is dropped keeps
// it: read once and dropped after, it lost its table while it ran.
func TestARunMarkedSeenAsItIsTakenForStoppedKeepsItsTable(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	running := stageIn(t, acquire(t, pool), owner, []Item{itemFor(t, "mine-1")})
	age(t, pool, running)
	seen := testenv.InTransaction(t, pool, `UPDATE import_staging.runs SET seen_at = now() WHERE staging = $1`, running.name)
	imported := make(chan error, 1)
	go func() {
		_, err := Import(ctx, pool, owner.String(), []Item{itemFor(t, "new-1")})
		imported <- err
	}()
	testenv.WaitUntilTrue(t, pool, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')`)
	if err := seen.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-imported; err != nil {
		t.Fatal(err)
	}
	if got, want := stagingTables(t, pool), []string{running.name, "runs"}; !slices.Equal(got, want) {
		t.Errorf("import_staging holds %q, want %q: the run seen meanwhile keeps its table", got, want)
	}
}

// A stopped run's row drops only a staging table of the name an import
// gives it: a row naming runs (written by hand) dropped the table of runs.
func TestAStoppedRunDropsOnlyAStagingTable(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO import_staging.runs (staging, owner_id, seen_at) VALUES ('runs', $1, now() - interval '1 day')`,
		owner); err != nil {
		t.Fatal(err)
	}
	if _, err := Import(ctx, pool, owner.String(), []Item{itemFor(t, "new-1")}); err != nil {
		t.Fatalf("Import beside a run named runs: %v", err)
	}
	if got := registeredRuns(t, pool); !slices.Equal(got, []string{"runs"}) {
		t.Errorf("runs registered: %q, want the one named runs, left alone", got)
	}
}

// An import that cannot drop its staging table as it ends (a pg_dump holds
// a lock on it) says so, naming the table and why, and leaves it
// registered for a later import; the statement it gives drops it. The drop
// failed without a word, and a copy of the catalog stayed for at least
// stagingStaleAfter by nobody's account.
func TestAnImportThatCannotDropItsStagingSaysSo(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	var dump pgx.Tx
	file := &atEnd{r: strings.NewReader(`{"id":"a-1","status":"active","currency":"EUR","images":[],"texts":{"ENG":{"title":"t"}}}` + "\n")}
	file.then = func() error { // as the file ends, its table exists and is written to
		var name string
		if err := pool.QueryRow(ctx, `SELECT staging FROM import_staging.runs WHERE owner_id = $1`, owner).Scan(&name); err != nil {
			return err
		}
		var err error
		if dump, err = pool.Begin(ctx); err != nil {
			return err
		}
		t.Cleanup(func() { _ = dump.Rollback(ctx) })
		_, err = dump.Exec(ctx, "LOCK TABLE "+pgx.Identifier{"import_staging", name}.Sanitize()+" IN ACCESS SHARE MODE")
		return err
	}
	res, err := ImportJSONL(ctx, pool, owner.String(), file)
	if file.err != nil {
		t.Fatalf("locking the import's table as its file ended: %v", file.err)
	}
	if err != nil || res.Inserted != 1 {
		t.Fatalf("Import = %+v, %v; want 1 item inserted, the table's lock notwithstanding", res, err)
	}
	left := res.StagingLeft
	if left == nil {
		t.Fatalf("Import's StagingLeft = nil, want the table it could not drop")
	}
	if got, want := registeredRuns(t, pool), []string{left.Name}; !slices.Equal(got, want) {
		t.Errorf("runs registered: %q, want %q, the table left, kept for a later import", got, want)
	}
	if got, want := stagingTables(t, pool), []string{left.Name, "runs"}; !slices.Equal(got, want) {
		t.Errorf("import_staging holds %q, want %q", got, want)
	}
	if !strings.Contains(left.Err.Error(), "55P03") || left.Table() != "import_staging."+left.Name {
		t.Errorf("StagingLeft = %s (%v), want import_staging.%s and the lock's timeout (55P03)", left.Table(), left.Err, left.Name)
	}
	if err := dump.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, left.DropStatement()); err != nil {
		t.Fatalf("%s: %v", left.DropStatement(), err)
	}
	assertNoStagingLeft(t, pool)
}

// atEnd reads r and, as r ends, calls then once, keeping its error.
type atEnd struct {
	r    io.Reader
	then func() error
	err  error
	done bool
}

func (a *atEnd) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if err == io.EOF && !a.done {
		a.done = true
		a.err = a.then()
	}
	return n, err
}

// age makes run look stopped: not seen for stagingStaleAfter.
func age(t *testing.T, pool *pgxpool.Pool, run *stagingRun) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE import_staging.runs SET seen_at = now() - make_interval(secs => $2) WHERE staging = $1`,
		run.name, (stagingStaleAfter + time.Second).Seconds()); err != nil {
		t.Fatal(err)
	}
}

// An import cut short (a Ctrl-C: its context cancelled) while it stages or
// writes drops its table all the same: pgx closes the connection a
// statement was cancelled on, so the drop goes through the pool.
func TestAnImportCutShortDropsItsStaging(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	var items []Item
	for n := range 30000 {
		items = append(items, itemFor(t, fmt.Sprintf("cut-%05d", n)))
	}
	for _, after := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(after, cancel)
		_, err := Import(ctx, pool, owner.String(), items)
		cancel()
		if err == nil {
			t.Fatalf("an import cancelled after %v ended without an error: make it longer", after)
		}
		// Said as what it was: cut in its COPY, the closed connection's
		// read error stood in for the Ctrl-C.
		if !errors.Is(err, context.Canceled) {
			t.Errorf("an import cancelled after %v = %v, want context.Canceled", after, err)
		}
		assertNoStagingLeft(t, pool)
	}
}

// An import whose staging table was dropped meanwhile (another import took
// it for stopped) stops with ErrStagingLost, which names the cause, and
// writes nothing more: its next chunk's statement finds no table.
func TestAnImportWhoseStagingWasDroppedStops(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	conn, other := acquire(t, pool), acquire(t, pool)
	run := stageIn(t, conn, owner, []Item{itemFor(t, "a-1")})
	if err := dropStaging(ctx, other, run.name); err != nil {
		t.Fatal(err)
	}
	_, err := writeStaged(ctx, conn, owner, run, 1)
	if err = stagingError(err, run); !errors.Is(err, ErrStagingLost) {
		t.Fatalf("error = %v, want ErrStagingLost", err)
	}
	if ids := itemIDs(t, pool, owner); len(ids) != 0 {
		t.Errorf("items written: %q, want none", ids)
	}
}

// A run is marked seen once stagingSeenEvery has passed since it last was,
// and a run that is no longer registered says its table is lost.
func TestARunIsMarkedSeenWhileItRuns(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	conn := acquire(t, pool)
	run := stageIn(t, conn, owner, nil)
	if _, err := pool.Exec(ctx, `UPDATE import_staging.runs SET seen_at = now() - interval '1 hour' WHERE staging = $1`, run.name); err != nil {
		t.Fatal(err)
	}
	seenFor := func() time.Duration {
		var age float64
		if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM now() - seen_at) FROM import_staging.runs WHERE staging = $1`,
			run.name).Scan(&age); err != nil {
			t.Fatal(err)
		}
		return time.Duration(age * float64(time.Second))
	}
	if err := run.markSeenIfDue(ctx, conn); err != nil || seenFor() < 59*time.Minute {
		t.Fatalf("marked seen %v after it was (%v), want not yet", seenFor(), err)
	}
	run.seenAt = time.Now().Add(-stagingSeenEvery)
	if err := run.markSeenIfDue(ctx, conn); err != nil || seenFor() > time.Minute {
		t.Fatalf("seen %v ago once due (%v), want now", seenFor(), err)
	}
	if err := dropStaging(ctx, conn, run.name); err != nil {
		t.Fatal(err)
	}
	run.seenAt = time.Time{}
	if err := run.markSeenIfDue(ctx, conn); !errors.Is(err, ErrStagingLost) {
		t.Errorf("marking a run dropped meanwhile: %v, want ErrStagingLost", err)
	}
}

// An import whose staging table ends before the count it staged (it
// cannot, but writeStaged checks) says how many it wrote before: it
// returned an error without the count, which exportctl read as "nothing
// written".
func TestImportShortOfItsStagedCountSaysWhatItWrote(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	conn := acquire(t, pool)
	run := stageIn(t, conn, owner, []Item{itemFor(t, "only-one")})
	_, err := writeStaged(ctx, conn, owner, run, 2)
	var cut *WriteError
	if !errors.As(err, &cut) || cut.Written != 1 || cut.Total != 2 || cut.AtLeast {
		t.Errorf("writeStaged of 1 item staged, 2 counted = %v, want a WriteError of 1 written of 2", err)
	}
}

// stageIn opens a staging run for owner on conn and copies items into it.
func stageIn(t *testing.T, conn *pgx.Conn, owner pgtype.UUID, items []Item) *stagingRun {
	t.Helper()
	run, err := openStaging(context.Background(), conn, owner)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := copyBatches(context.Background(), conn, run, itemRows(items)); err != nil {
		t.Fatal(err)
	}
	return run
}

// assertNoStagingLeft fails the test if any staging table or run is left,
// in import_staging or as a TEMP table of any session.
func assertNoStagingLeft(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if got := stagingTables(t, pool); !slices.Equal(got, []string{"runs"}) {
		t.Errorf("import_staging holds %q, want only runs", got)
	}
	if got := registeredRuns(t, pool); len(got) != 0 {
		t.Errorf("runs left registered: %q", got)
	}
	var temp int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname LIKE 'pg_temp%' AND c.relkind = 'r'`).Scan(&temp); err != nil || temp != 0 {
		t.Errorf("%d temporary tables left (%v), want none", temp, err)
	}
}

// stagingTables lists the tables of the import_staging schema.
func stagingTables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return strings.Fields(queryText(t, pool, `SELECT coalesce(string_agg(tablename, ' ' ORDER BY tablename = 'runs', tablename), '')
FROM pg_tables WHERE schemaname = 'import_staging'`))
}

// registeredRuns lists the staging tables registered in import_staging.runs.
func registeredRuns(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return strings.Fields(queryText(t, pool, `SELECT coalesce(string_agg(staging, ' ' ORDER BY staging), '') FROM import_staging.runs`))
}

func queryText(t *testing.T, pool *pgxpool.Pool, sql string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// itemIDs lists owner's item ids in order.
func itemIDs(t *testing.T, pool *pgxpool.Pool, owner pgtype.UUID) []string {
	t.Helper()
	var ids []string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM export_items WHERE owner_id = $1`,
		owner).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

// ownerIn creates an owner in pool's database and returns its id.
func ownerIn(t *testing.T, pool *pgxpool.Pool) pgtype.UUID {
	t.Helper()
	var owner pgtype.UUID
	if err := pool.QueryRow(context.Background(), `INSERT INTO owners (name) VALUES ('test') RETURNING id`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	return owner
}

// itemWithText is a valid item with id whose description is text in
// every language.
func itemWithText(t *testing.T, id, text string) Item {
	t.Helper()
	items, err := ParseJSONL(strings.NewReader(`{"id":"` + id + `","status":"active","currency":"EUR","images":[],"texts":{` +
		`"ENG":{"title":"t","description":"` + text + `"},"RUS":{"title":"t","description":"` + text + `"},"UKR":{"title":"t","description":"` + text + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	return items[0]
}

// itemFor is a valid item with id.
func itemFor(t *testing.T, id string) Item {
	t.Helper()
	items, err := ParseJSONL(strings.NewReader(`{"id":"` + id + `","status":"active","currency":"EUR","images":[],"texts":{"ENG":{"title":"t"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	return items[0]
}

// acquire is a connection of pool of its own, released when the test ends.
func acquire(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Release)
	return c.Conn()
}
