// Command tracestore is the local trace view of `make run`: an OTLP/HTTP
// receiver that appends every span to a JSON Lines file, and a lookup that
// prints one request's trace as a tree.
//
//	tracestore serve [--addr 127.0.0.1:4318] [--file .run/traces.jsonl] [--max-bytes N]
//	tracestore show [--file .run/traces.jsonl] REQUEST_ID
//
// serve keeps the file under --max-bytes: past it, the file becomes
// FILE.1 (the one there before gone) and a new one starts, so a stack left
// up for days no longer fills the disk; show reads FILE and FILE.1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/acceptretry"
	"github.com/coinexport/export/pkg/cappedfile"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/stopsignal"
	"github.com/coinexport/export/pkg/tracestore"
)

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tracestore:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: tracestore serve|show [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:4318", "OTLP/HTTP listen address")
	file := fs.String("file", ".run/traces.jsonl", "span file")
	maxBytes := fs.Int64("max-bytes", 0, "serve: the size past which the span file becomes FILE.1 and starts afresh (0: none)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "serve":
		return serve(ctx, *addr, *file, *maxBytes, stdout)
	case "show":
		if fs.NArg() != 1 {
			return errors.New("usage: tracestore show [--file F] REQUEST_ID")
		}
		return show(stdout, *file, fs.Arg(0))
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// serve receives spans on addr into file, capped at maxBytes (0: none),
// until ctx ends; its few log lines go to logs.
func serve(ctx context.Context, addr, file string, maxBytes int64, logs io.Writer) error {
	log := slog.New(slog.NewJSONHandler(logs, nil)).With("service", "tracestore")
	f, err := cappedfile.Open(file, maxBytes)
	if err != nil {
		return err
	}
	defer f.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// Like every listener of the stack's (acceptretry): out of descriptors,
	// net/http logged each failed accept, once a second, and out of kernel
	// memory (ENOMEM, ENOBUFS) its Serve returned, tracestore exited, and
	// make run stopped the whole stack for it.
	ln = acceptretry.New(ln, acceptretry.LogRetries(log))
	srv := &http.Server{Handler: tracestore.New(f, 1), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		DisableGeneralOptionsHandler: true} // "OPTIONS *" gets the handler's answer too
	drained := make(chan error, 1)
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		drained <- srv.Shutdown(shutdownCtx)
	}()
	// Its answers are envelopes, net/http's own included.
	if err := srv.Serve(httpserver.UnreadAsEnvelope(ln, nil)); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	// Serve returns as soon as Shutdown begins; the exports still being
	// received (the last batches of the binaries stopping before this one)
	// write to f until Shutdown returns.
	if err := <-drained; err != nil {
		return fmt.Errorf("stopped with exports still being received: %w", err)
	}
	return nil
}

var traceIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// show prints the trace of requestID from file and from file.1: the spans
// of the make run before, which make run keeps once when it starts, or
// this run's older ones, once serve's --max-bytes moved them there.
func show(w io.Writer, file, requestID string) error {
	// A request id quoted in a ticket often comes back upper-cased, or
	// with the spaces a copy picked up; hex reads the same either way.
	requestID = strings.ToLower(strings.TrimSpace(requestID))
	if !traceIDPattern.MatchString(requestID) {
		return fmt.Errorf("%q is not a request id (32 hex characters)", requestID)
	}
	var earliest time.Time // of every span kept, for a request older than them all
	spans, err := spansIn(file, func(sp tracestore.Span) bool {
		if earliest.IsZero() || sp.Start.Before(earliest) {
			earliest = sp.Start
		}
		return sp.TraceID == requestID
	})
	if err != nil {
		return err
	}
	if len(spans) == 0 {
		return noSpansError(requestID, file, earliest)
	}
	// The spans linked from other traces (the gateway's Redis round trip,
	// held by the first traced request it decided) and their children.
	var linked []tracestore.Span
	if targets := tracestore.LinkTargets(spans); len(targets) > 0 {
		linked, err = spansIn(file, func(sp tracestore.Span) bool { return targets[sp.SpanID] || targets[sp.ParentID] })
		if err != nil {
			return err
		}
	}
	tracestore.WriteTree(w, spans, linked)
	return nil
}

// noSpansError says that file and file.1 hold no span of requestID, and
// why that may be. Some requests record no span at all: their log lines,
// beside the span file under make run, are all there is. A request older
// than the earliest span kept has none left: it was sent to retry in a few
// seconds. Its log lines may be left all the same: file.1 holds the run
// before, or this run's older spans once file reached --max-bytes, and
// each log file moves to its .1 at its own size (a request of this run
// whose spans were gone was said to have no log lines left either).
func noSpansError(requestID, file string, earliest time.Time) error {
	logs := filepath.Join(filepath.Dir(file), "logs", "*.log*")
	kept := "no span is kept yet"
	if !earliest.IsZero() {
		kept = "the spans kept begin at " + earliest.UTC().Format(time.DateTime) + " UTC: " +
			"a request older than that has no span left"
	}
	return fmt.Errorf("no spans for request id %s in %s nor %s.1, the older spans; %s. Spans are exported in batches: "+
		"a request of the last seconds may be there on a retry. A health check records none, nor a request not sampled: "+
		"grep %s %s finds its log lines", requestID, file, file, kept, requestID, logs)
}

// spansIn returns the spans of file.1 and file that keep takes.
func spansIn(file string, keep func(tracestore.Span) bool) ([]tracestore.Span, error) {
	last, err := spansOf(file+".1", keep)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	spans, err := spansOf(file, keep)
	if err != nil {
		return nil, err
	}
	return append(last, spans...), nil
}

// spansOf returns the spans in file that keep takes.
func spansOf(file string, keep func(tracestore.Span) bool) ([]tracestore.Span, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var spans []tracestore.Span
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var sp tracestore.Span
		if json.Unmarshal(sc.Bytes(), &sp) == nil && keep(sp) {
			spans = append(spans, sp)
		}
	}
	return spans, sc.Err()
}
