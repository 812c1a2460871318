// Command gateway is the public edge of the export service: API keys,
// scopes, request ids, rate limits, and a safe proxy to the services.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/coinexport/export/gateway/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	applyGCDefaults(os.Getenv)
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends; tests call it with their own getenv.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	return edge.Run(ctx, getenv, stdout)
}

// GC defaults of the gateway, used unless GOGC or GOMEMLIMIT are set.
// Almost everything the gateway allocates dies within its request, and its
// live heap is a few MB, so Go's default (a collection each time the heap
// doubles) runs the collector thousands of times a minute under load, CPU
// taken from the services on the same machine. Collecting at 5× the live
// heap does a quarter of that work; the memory limit bounds the heap all
// the same (the collector works harder as it nears the limit).
const (
	defaultGCPercent   = 400
	defaultMemoryLimit = 100 << 20
)

func applyGCDefaults(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
}
