// Command loadgen is the load generator and report writer behind make bench.
// Each subcommand runs one scenario against a running stack (or PostgreSQL
// directly, for the baselines) and appends one JSON record to a results file;
// "report" turns the records into the table of BENCHMARKS.md.
//
// Secrets (API keys, the identity secret, the DSN) come from the environment,
// never from flags, so they do not show in ps or in the bench log.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/coinexport/export/pkg/stopsignal"
)

const usage = `usage: loadgen SCENARIO [flags]

  scan         raw pgx keyset scan of an owner's items (the sync baseline)
  sync         full sync through HTTP, following meta.next_cursor
  incremental  change a fraction of the items, then sync with updated_after
  get          GET /v1/export/items/{id} with random ids, run by wrk
  sales        confirm + cancel pairs, one platform key per worker
  replay       platforms replaying a backlog of sales as the README's sales guide says, then checked
  neighbours   what an owner flooding the stack costs another owner's paced load
  ids          write random item ids of an owner to a file
  nginx-conf   write an nginx reverse-proxy config
  rss          record (or reset) the peak RSS of a process
  report       render the results file as the BENCHMARKS.md table

Run "loadgen SCENARIO -h" for its flags. Environment: see config.go.`

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the flag package has listed the scenario's flags
		}
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		if errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("invalid usage")

// scenario is one subcommand.
type scenario func(ctx context.Context, cfg Config, args []string, stdout io.Writer) error

var scenarios = map[string]scenario{
	"scan":        runScan,
	"sync":        runSync,
	"incremental": runIncremental,
	"get":         runGet,
	"sales":       runSales,
	"replay":      runReplay,
	"neighbours":  runNeighbours,
	"ids":         runIDs,
	"nginx-conf":  runNginxConf,
	"rss":         runRSS,
	"report":      runReport,
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 1 && helpWords[args[0]] {
		_, err := fmt.Fprintln(stdout, usage)
		return err
	}
	if len(args) == 0 || scenarios[args[0]] == nil {
		names := make([]string, 0, len(scenarios))
		for n := range scenarios {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("%w: want one of %s", errUsage, strings.Join(names, ", "))
	}
	cfg, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	return scenarios[args[0]](ctx, cfg, args[1:], stdout)
}

// helpWords ask for the scenarios' list, as -h after one asks for its flags.
var helpWords = map[string]bool{"-h": true, "-help": true, "--help": true, "help": true}

// parseFlags parses a scenario's flags, reporting errors as usage errors.
// A -h is flag.ErrHelp, as asked (exit 0 with the flags listed), not an
// invalid usage followed by the scenarios' list.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

func errUsagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}
