// Command salesdrill sends a long concurrent history of sale calls and reads
// through a running stack's gateway while something else injects faults
// (deploy/local/salesdrill.sh kills and restarts the processes), then
// settles every call of unknown outcome, and checks the history against
// the sale state machine (package salescheck) and the database against
// the answers. It exits 1 on a violation, naming it; with -report it also
// writes the checker's visualization of a history that is not
// linearizable (HTML), and with -history the history (JSON lines).
//
//	salesdrill -base http://127.0.0.1:8080/v1 -keys FILE -database DSN -owner UUID -items a,b,c [flags]
//
// FILE holds one "platform=key" line per sales:write key and one
// "read=key" line with an export:read key of the same owner (a file, not
// flags: a process's arguments are readable by every local user).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/stopsignal"
	"github.com/coinexport/export/services/sales-writer/salescheck"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	// The first signal ends the calls (the history sent so far is still
	// settled and checked); a second one ends the process.
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "salesdrill:", err)
		os.Exit(1)
	}
}

// config is what the flags say.
type config struct {
	base, keysFile, database, owner, report, history string
	items                                            []string
	workload                                         salescheck.Workload
	duration, settle, checkTimeout, retention        time.Duration
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("salesdrill", flag.ContinueOnError)
	fs.StringVar(&c.base, "base", "http://127.0.0.1:8080/v1", "the API's base URL")
	fs.StringVar(&c.keysFile, "keys", "", "file of platform=key lines and a read=key line (required)")
	fs.StringVar(&c.database, "database", "", "PostgreSQL DSN of the stack's database (required)")
	fs.StringVar(&c.owner, "owner", "", "the owner whose items and keys these are (required)")
	items := fs.String("items", "", "comma-separated ids of the owner's active items to sell (required)")
	fs.StringVar(&c.report, "report", "", "write the checker's visualization (HTML) of a violation here")
	fs.StringVar(&c.history, "history", "", "write the history here (JSON lines)")
	fs.IntVar(&c.workload.Clients, "clients", 12, "concurrent clients")
	fs.IntVar(&c.workload.Calls, "calls", 1_000_000, "calls per client at most")
	fs.Uint64Var(&c.workload.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the clients' choices")
	fs.DurationVar(&c.duration, "duration", time.Minute, "how long the clients send calls")
	fs.DurationVar(&c.workload.Pause, "pause", 150*time.Millisecond, "the longest wait of a client between two calls")
	fs.DurationVar(&c.workload.Timeout, "timeout", 40*time.Second, "a call's timeout (past the gateway's own 30 s and its repeat)")
	fs.DurationVar(&c.workload.ShortTimeout, "short-timeout", 50*time.Millisecond, "the longest short timeout")
	fs.Float64Var(&c.workload.ShortShare, "short-share", 0.1, "the share of calls given a short timeout")
	fs.DurationVar(&c.settle, "settle", 3*time.Minute, "how long settling the unknown calls may take")
	fs.DurationVar(&c.checkTimeout, "check-timeout", 5*time.Minute, "how long the linearizability check may take")
	fs.DurationVar(&c.retention, "retention", 24*time.Hour, "the writers' IDEMPOTENCY_RETENTION (a refusal's binding is stamped as its expiry less this)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.items = strings.Split(*items, ",")
	if c.keysFile == "" || c.database == "" || c.owner == "" || *items == "" {
		return c, errors.New("-keys, -database, -owner and -items are required")
	}
	c.workload.Items = c.items
	return c, nil
}

// readKeys reads the keys file: the sale keys by platform and the read key.
func readKeys(path string) (sale map[string]string, read string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	sale = map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, key, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		switch {
		case !ok:
			continue
		case name == "read":
			read = key
		default:
			sale[name] = key
		}
	}
	if len(sale) == 0 || read == "" {
		return nil, "", fmt.Errorf("%s: want platform=key lines and a read=key line", path)
	}
	return sale, read, sc.Err()
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	c, err := parseFlags(args)
	if err != nil {
		return err
	}
	saleKeys, readKey, err := readKeys(c.keysFile)
	if err != nil {
		return err
	}
	for p := range saleKeys {
		c.workload.Platforms = append(c.workload.Platforms, p)
	}
	db, err := pgxpool.New(ctx, c.database)
	if err != nil {
		return err
	}
	defer postgres.Close(db) // bounded, as every binary's: a Ctrl-C while a check's query is queued behind PgBouncer

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	send := salescheck.HTTPSender(client, c.base, saleKeys, readKey)
	h := salescheck.NewHistory()
	end := time.Now().Add(c.duration)
	c.workload.Until = func() bool { return time.Now().After(end) }
	fmt.Fprintf(stdout, "salesdrill: %d clients on %d items, %d platforms, for %v (seed %d)\n",
		c.workload.Clients, len(c.items), len(saleKeys), c.duration, c.workload.Seed)
	c.workload.Run(ctx, send, h)
	fmt.Fprintf(stdout, "salesdrill: settling\n")
	settleCtx, cancel := context.WithTimeout(ctx, c.settle)
	settleErr := c.workload.Settle(settleCtx, send, h, 200*time.Millisecond)
	cancel()
	return check(ctx, c, db, h, settleErr, stdout)
}

// check runs every check of the history and reports each violation.
func check(ctx context.Context, c config, db *pgxpool.Pool, h *salescheck.History, settleErr error, stdout io.Writer) error {
	calls, ops := h.Calls(), h.Operations()
	fmt.Fprintf(stdout, "salesdrill: %d calls: %s\n", len(calls), salescheck.Counts(calls))
	var errs []error
	if c.history != "" {
		if err := writeHistory(h, c.history); err != nil {
			errs = append(errs, err)
		}
	}
	if settleErr != nil {
		errs = append(errs, fmt.Errorf("settling: %w", settleErr))
	}
	for _, u := range salescheck.Unexpected(calls) {
		errs = append(errs, fmt.Errorf("unexpected answer: %s", u))
	}
	began := time.Now()
	info, err := salescheck.Linearizable(ops, c.checkTimeout)
	fmt.Fprintf(stdout, "salesdrill: linearizability checked in %v\n", time.Since(began).Round(time.Millisecond))
	if err != nil {
		errs = append(errs, err)
	}
	// Only a violation's: drawing the partial linearizations of a check
	// that ran out of time can take longer than the check did.
	if c.report != "" && errors.Is(err, salescheck.ErrNotLinearizable) {
		if err := porcupine.VisualizePath(salescheck.Model(), info, c.report); err != nil {
			errs = append(errs, fmt.Errorf("report: %w", err))
		} else {
			fmt.Fprintf(stdout, "salesdrill: the history's visualization: %s\n", c.report)
		}
	}
	if err := salescheck.Database(ctx, db, c.owner, calls); err != nil {
		errs = append(errs, fmt.Errorf("database: %w", err))
	}
	claims, err := salescheck.NothingAppliedHolds(ctx, db, c.owner, h, c.retention)
	fmt.Fprintf(stdout, "salesdrill: %s\n", claims)
	if err != nil {
		errs = append(errs, fmt.Errorf("nothing was applied, but: %w", err))
	}
	if len(errs) == 0 {
		fmt.Fprintln(stdout, "salesdrill: PASS: linearizable, settled, database consistent with every answer, every 'nothing was applied' held")
	}
	return errors.Join(errs...)
}

func writeHistory(h *salescheck.History, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := h.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
