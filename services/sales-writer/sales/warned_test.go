package sales

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A call committing alone whose COMMIT's wait for a synchronous standby
// someone else cuts (an operator's pg_cancel_backend, to release commits
// stuck behind a lost standby) is answered as done, and told of: a WARN
// line naming its request id, item, platform, operation and key, the
// warning's SQLSTATE and severity; a count; an event on its span. So too
// under client_min_messages = error in DATABASE_URL, where PostgreSQL
// would send the writer no WARNING unless the call asked for it: alone
// (SALES_WRITER_COMMIT_GROUPS=0, or run alone) and in a group of one.
func TestACallAloneWhoseCommitWaitIsCutIsToldOf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, admin, owner := primaryAwaitingAStandby(t, "a", "b")
	for _, c := range aloneAndInAGroupOfOne {
		app := "sales-alone-" + c.item
		rec := tracetest.NewSpanRecorder()
		callCtx, span := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test").Start(ctx, "sale")
		told, done := confirmOnAWriterOfItsOwn(t, callCtx,
			primary+" application_name="+app+" synchronous_commit=on client_min_messages=error pool_max_conns=1", c.groups, owner, c.item)
		cutCommitWait(t, admin, app)
		got := answered(t, c.name, done)
		span.End()
		if got.err != nil || got.res.Status != "inactive" || got.res.IdempotentReplay {
			t.Errorf("%s: a confirm whose commit wait was cut = %+v, %v; want it sold (200)", c.name, got.res, got.err)
		}
		want := warnedLine{Level: "WARN", Msg: warnedCommitMessage, RequestID: "req-" + c.item, SQLState: "01000", Severity: "WARNING", TransactionCalls: 1,
			Transaction: "sale", Outcome: outcomeExecuted, ItemStatus: "inactive",
			OwnerID: owner, Operation: string(Confirm), ItemID: c.item, PlatformID: "p", ExternalOrderID: "o-" + c.item, IdempotencyKey: "k-" + c.item}
		if lines := told.lines(t); len(lines) != 1 || lines[0] != want {
			t.Errorf("%s: lines told = %+v, want one: %+v", c.name, lines, want)
		}
		if n := told.count(t); n != 1 {
			t.Errorf("%s: sales_writer_commit_warned_calls_total = %v, want 1", c.name, n)
		}
		if !slices.ContainsFunc(rec.Ended()[0].Events(), func(e sdktrace.Event) bool { return e.Name == warnedEvent }) {
			t.Errorf("%s: the call's span has no event %q: %+v", c.name, warnedEvent, rec.Ended()[0].Events())
		}
	}
}

// A group whose COMMIT's wait someone else cuts (no call of it left) is
// answered as done, every call of it, and told of in a line per call, its
// request id at the top level, where a search of the logs by request id
// looks; its calls counted; client_min_messages = error in DATABASE_URL
// does not hide it.
func TestAGroupWhoseCommitWaitIsCutIsToldOf(t *testing.T) {
	t.Parallel()
	var told *warnedTold
	g := groupWaitingForAStandby(t, func(t testing.TB, dsn string) *pgxpool.Pool {
		return openRecording(t, dsn+" client_min_messages=error")
	}, func(w *Writer) { told = tellWarned(w) })
	cutCommitWait(t, g.admin, committingApp)
	if err := <-g.left; err != nil {
		t.Errorf("the call confirming a, its group's commit wait cut = %v, want it sold", err)
	}
	if got := answered(t, "the call confirming b", g.stay); got.err != nil || got.res.Status != "inactive" {
		t.Errorf("the call confirming b, its group's commit wait cut = %+v, %v; want it sold", got.res, got.err)
	}
	var ids []string
	for _, line := range told.lines(t) {
		if line.SQLState != "01000" || line.WriterSentCancel || line.TransactionCalls != 2 || line.Level != "WARN" ||
			line.Outcome != outcomeExecuted || line.ItemStatus != "inactive" {
			t.Errorf("line told = %+v, want one at WARN of SQLSTATE 01000, not cancelled by the writer, of a transaction of 2 calls, its call executed", line)
		}
		ids = append(ids, line.RequestID)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"req-a", "req-b"}) {
		t.Errorf("request ids of the lines = %v, want [req-a req-b]", ids)
	}
	if n := told.count(t); n != 2 {
		t.Errorf("sales_writer_commit_warned_calls_total = %v, want 2", n)
	}
}

// A transaction without a WARNING is told of nowhere, though the
// connection it ran on was warned of before, by a statement that was not
// the call's: alone (SALES_WRITER_COMMIT_GROUPS=0), in a group of one and
// in a group of two, no line and no count.
func TestACommitWithoutAWarningIsNotToldOf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	admin := testenv.Pool(t, dsn)
	owner := saleFixture(t, admin, "a", "b", "c", "d")
	db := openRecording(t, dsn+" pool_max_conns=1")
	// A writer per case: a grouping writer's runner outlives its call for
	// a moment, which holdRunners must not find.
	alone := NewGroupingWriter(db, time.Hour, 0, GroupStats{})
	ofOne := NewGroupingWriter(db, time.Hour, 1, GroupStats{})
	w := NewGroupingWriter(db, time.Hour, 1, GroupStats{})
	told := []*warnedTold{tellWarned(alone), tellWarned(ofOne), tellWarned(w)}
	for i, w := range []*Writer{alone, ofOne} {
		if _, err := db.Exec(ctx, "DO $$ BEGIN RAISE WARNING 'not the sale''s'; END $$"); err != nil {
			t.Fatal(err)
		}
		item := []string{"a", "b"}[i]
		if _, err := w.Execute(ctx, confirmOf(owner, "k-"+item, item, "o-"+item)); err != nil {
			t.Fatal(err)
		}
	}
	release := holdRunners(t, w)
	answers := make([]chan answer, 2)
	for i, item := range []string{"c", "d"} {
		answers[i] = make(chan answer, 1)
		go func() {
			res, err := w.Execute(ctx, confirmOf(owner, "k-"+item, item, "o-"+item))
			answers[i] <- answer{res, err}
		}()
		queued(t, w, i+1)
	}
	if _, err := db.Exec(ctx, "DO $$ BEGIN RAISE WARNING 'not the group''s'; END $$"); err != nil {
		t.Fatal(err)
	}
	release()
	for i := range answers {
		if got := answered(t, "a call of the group", answers[i]); got.err != nil {
			t.Fatal(got.err)
		}
	}
	for i, told := range told {
		if lines := told.lines(t); len(lines) != 0 {
			t.Errorf("writer %d: lines told = %+v, want none", i, lines)
		}
		if n := told.count(t); n != 0 {
			t.Errorf("writer %d: sales_writer_commit_warned_calls_total = %v, want 0", i, n)
		}
	}
}

// A call refused (its item sold meanwhile) whose refusal's binding
// commits with a warning (its wait for a synchronous standby cut) is told
// of as refused, with the refusal bound and the transaction named a
// refusal's binding: a line that gave no outcome read as a sale to
// reconcile. Alone and in a group of one.
func TestAWarnedLineSaysWhatItsCallDid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, admin, owner := primaryAwaitingAStandby(t, "a", "b")
	// Sold by another path, committed without waiting (the pair's
	// primary commits asynchronously but for the writer's sessions).
	if _, err := admin.Exec(ctx, "UPDATE export_items SET sold = true"); err != nil {
		t.Fatal(err)
	}
	for _, c := range aloneAndInAGroupOfOne {
		app := "sales-refused-" + c.item
		told, done := confirmOnAWriterOfItsOwn(t, ctx, primary+" application_name="+app+" synchronous_commit=on pool_max_conns=1", c.groups, owner, c.item)
		cutCommitWait(t, admin, app)
		if got := answered(t, c.name, done); !errors.Is(got.err, ErrAlreadySold) {
			t.Errorf("%s: a confirm of a sold item = %+v, %v; want ErrAlreadySold", c.name, got.res, got.err)
		}
		lines := told.lines(t)
		if len(lines) != 1 || lines[0].RequestID != "req-"+c.item || lines[0].Transaction != "refusal_binding" ||
			lines[0].Outcome != outcomeRefused || lines[0].Refusal != "item_already_sold" {
			t.Errorf("%s: lines told = %+v, want one of req-%s, a refusal's binding, refused item_already_sold", c.name, lines, c.item)
		}
	}
}

// outcomeOf names what a call did as its answer says it: executed (and the
// item's status after it), replayed, refused or replayed_refusal (and the
// refusal), failed (and the error).
func TestOutcomeOfNamesWhatTheCallDid(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		res  Result
		err  error
		want string
	}{
		{Result{Status: "inactive"}, nil, `outcome=executed item_status=inactive`},
		{Result{Status: "active", IdempotentReplay: true}, nil, `outcome=replayed item_status=active`},
		{Result{}, ErrAlreadySoldToThisOrder, `outcome=refused refusal=item_already_sold_to_this_order`},
		{Result{}, replayRefusal("sale_not_cancelable"), `outcome=replayed_refusal refusal=sale_not_cancelable`},
		{Result{}, ErrIdempotencyConflict, `outcome=refused refusal=idempotency_conflict`},
		{Result{}, ErrCommitUnconfirmed, `outcome=failed error=` + ErrCommitUnconfirmed.Error()},
	} {
		var got []string
		for _, a := range outcomeOf(c.res, c.err) {
			got = append(got, a.String())
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("outcomeOf(%+v, %v) = %s, want %s", c.res, c.err, g, c.want)
		}
	}
}

// Answering a call that heard no warning, nearly every call, allocates
// nothing and formats no error's text: its line's outcome (outcomeOf) is
// built only when there is a line to tell. Executed, failed (an error
// whose text is formatted on each Error) and refused alike.
func TestAnsweringACallWithNothingWarnedAllocatesNothing(t *testing.T) {
	told := newCommitWarnings().call(context.Background(), Request{})
	for _, c := range []struct {
		name string
		res  Result
		err  error
	}{
		{"executed", Result{Status: "sold"}, nil},
		{"failed", Result{}, &postgres.WarnedError{Warning: postgres.Warning{Code: "57P01", Severity: "WARNING"}, Err: errors.New("unexpected EOF")}},
		{"refused", Result{}, ErrAlreadySold},
	} {
		if allocs := testing.AllocsPerRun(100, func() { told.answer(c.res, c.err) }); allocs != 0 {
			t.Errorf("%s: answering a call with nothing warned allocates %v times, want 0", c.name, allocs)
		}
	}
}

// A call whose session is terminated (pg_terminate_backend) while its
// COMMIT waits for a synchronous standby (committed locally: PostgreSQL
// warns 57P01 and closes the connection) fails with an error naming the
// warning (postgres.WarnedError: its 503 "may have been applied" line
// said only "unexpected EOF"), and is told of as one to reconcile after a
// failover, failed: a line and a count, alone, in a group of one and in a
// group of two.
func TestACallWhoseCommitWaitIsTerminatedIsToldOf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, admin, owner := primaryAwaitingAStandby(t, "a", "b")
	for _, c := range aloneAndInAGroupOfOne {
		app := "sales-terminated-" + c.item
		told, done := confirmOnAWriterOfItsOwn(t, ctx, primary+" application_name="+app+" synchronous_commit=on pool_max_conns=1", c.groups, owner, c.item)
		terminateCommitWait(t, admin, app)
		got := answered(t, c.name, done)
		wantTerminatedInItsCommit(t, c.name, got.err)
		lines := told.lines(t)
		if len(lines) != 1 || lines[0].RequestID != "req-"+c.item || lines[0].Msg != warnedLostMessage || lines[0].SQLState != "57P01" ||
			lines[0].Outcome != outcomeFailed || lines[0].Error != got.err.Error() {
			t.Errorf("%s: lines told = %+v, want one of req-%s, ended after a 57P01 warning, failed with %v", c.name, lines, c.item, got.err)
		}
		if n := told.count(t); n != 1 {
			t.Errorf("%s: sales_writer_commit_warned_calls_total = %v, want 1", c.name, n)
		}
	}
}

// The same, for a group of two calls.
func TestAGroupWhoseCommitWaitIsTerminatedIsToldOf(t *testing.T) {
	t.Parallel()
	var told *warnedTold
	g := groupWaitingForAStandby(t, openRecording, func(w *Writer) { told = tellWarned(w) })
	terminateCommitWait(t, g.admin, committingApp)
	wantTerminatedInItsCommit(t, "the call confirming a", <-g.left)
	wantTerminatedInItsCommit(t, "the call confirming b", answered(t, "the call confirming b", g.stay).err)
	var ids []string
	for _, line := range told.lines(t) {
		if line.Msg != warnedLostMessage || line.SQLState != "57P01" || line.TransactionCalls != 2 || line.Outcome != outcomeFailed {
			t.Errorf("line told = %+v, want one ended after a 57P01 warning, of a transaction of 2 calls, failed", line)
		}
		ids = append(ids, line.RequestID)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"req-a", "req-b"}) {
		t.Errorf("request ids of the lines = %v, want [req-a req-b]", ids)
	}
	if n := told.count(t); n != 2 {
		t.Errorf("sales_writer_commit_warned_calls_total = %v, want 2", n)
	}
}

// wantTerminatedInItsCommit fails t unless err is what a call whose
// session was terminated in its commit's wait is answered: a connection
// lost (postgres.Unreachable) after the warning, which it names, and not
// aloneAndInAGroupOfOne are the two ways a call commits by itself, each on
// an item of its own of primaryAwaitingAStandby's: alone
// (SALES_WRITER_COMMIT_GROUPS=0) and in a group of one.
var aloneAndInAGroupOfOne = []struct {
	name   string
	groups int
	item   string
}{
	{"alone", 0, "a"},
	{"a group of one", 1, "b"},
}

// confirmOnAWriterOfItsOwn starts a confirm of owner's item (request id,
// key and order "req-", "k-" and "o-" and the item) on a writer of its own
// with groups, on dsn, and returns what the writer tells of warned
// transactions and the call's answer to come.
func confirmOnAWriterOfItsOwn(t *testing.T, ctx context.Context, dsn string, groups int, owner, item string) (*warnedTold, <-chan answer) {
	t.Helper()
	w := NewGroupingWriter(openRecording(t, dsn), time.Hour, groups, GroupStats{})
	told := tellWarned(w)
	callCtx := identity.WithContext(ctx, identity.Identity{RequestID: "req-" + item})
	done := make(chan answer, 1)
	go func() {
		res, err := w.Execute(callCtx, confirmOf(owner, "k-"+item, item, "o-"+item))
		done <- answer{res, err}
	}()
	return told, done
}

// one that says nothing was done.
func wantTerminatedInItsCommit(t *testing.T, what string, err error) {
	t.Helper()
	var warned *postgres.WarnedError
	if !errors.As(err, &warned) || warned.Warning.Code != "57P01" || !postgres.Unreachable(err) ||
		postgres.NothingDone(err) || postgres.RolledBack(err) || postgres.Terminated(err) {
		t.Errorf("%s, terminated in its commit's wait = %v, want a connection lost after the 57P01 warning, which it names", what, err)
	}
}

// terminateCommitWait waits for the session of app to wait for a
// synchronous standby in its COMMIT, and terminates it, as an operator
// may, with pg_terminate_backend.
func terminateCommitWait(t *testing.T, admin *pgxpool.Pool, app string) {
	t.Helper()
	waitingInSyncRep(t, admin, app)
	var ended int
	err := admin.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int FROM pg_stat_activity
		WHERE application_name = $1 AND wait_event = 'SyncRep'`, app).Scan(&ended)
	if err != nil || ended != 1 {
		t.Fatalf("terminated %d sessions of %s waiting in SyncRep (%v), want 1", ended, app, err)
	}
}

// cutCommitWait waits for the session of app to wait for a synchronous
// standby in its COMMIT, and ends that wait as an operator does, with
// pg_cancel_backend from a session of its own.
func cutCommitWait(t *testing.T, admin *pgxpool.Pool, app string) {
	t.Helper()
	waitingInSyncRep(t, admin, app)
	var cut int
	err := admin.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_cancel_backend(pid))::int FROM pg_stat_activity
		WHERE application_name = $1 AND wait_event = 'SyncRep'`, app).Scan(&cut)
	if err != nil || cut != 1 {
		t.Fatalf("cancelled %d sessions of %s waiting in SyncRep (%v), want 1", cut, app, err)
	}
}

// warnedTold is what a writer told of its transactions that committed
// with a warning: its log (JSON lines) and metrics.
type warnedTold struct {
	logs *testenv.Output
	reg  *prometheus.Registry
}

func tellWarned(w *Writer) *warnedTold {
	told := &warnedTold{logs: &testenv.Output{}, reg: prometheus.NewRegistry()}
	w.ReportWarnedCommits(slog.New(slog.NewJSONHandler(told.logs, nil)), told.reg)
	return told
}

// warnedLine is a WARN line of a call whose transaction committed with a
// warning, as read back.
type warnedLine struct {
	Level            string `json:"level"`
	Msg              string `json:"msg"`
	RequestID        string `json:"request_id"`
	SQLState         string `json:"sqlstate"`
	Severity         string `json:"severity"`
	WriterSentCancel bool   `json:"writer_sent_cancel"`
	TransactionCalls int    `json:"transaction_calls"`
	Transaction      string `json:"transaction"`
	Outcome          string `json:"outcome"`
	ItemStatus       string `json:"item_status"`
	Refusal          string `json:"refusal"`
	Error            string `json:"error"`
	OwnerID          string `json:"owner_id"`
	Operation        string `json:"operation"`
	ItemID           string `json:"item_id"`
	PlatformID       string `json:"platform_id"`
	ExternalOrderID  string `json:"external_order_id"`
	IdempotencyKey   string `json:"idempotency_key"`
}

// lines returns every line logged, read back; any line logged is one of
// a warned commit's.
func (w *warnedTold) lines(t *testing.T) []warnedLine {
	t.Helper()
	var lines []warnedLine
	for line := range strings.Lines(w.logs.String()) {
		var l warnedLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		lines = append(lines, l)
	}
	return lines
}

// count is sales_writer_commit_warned_calls_total.
func (w *warnedTold) count(t *testing.T) float64 {
	t.Helper()
	families, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "sales_writer_commit_warned_calls_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no sales_writer_commit_warned_calls_total gathered")
	return 0
}
