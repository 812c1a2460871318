// Command gateway is the public edge of the export service: API keys,
// scopes, request ids, rate limits, and a safe proxy to the services.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/coinexport/export/gateway/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends; tests call it with their own getenv.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	return edge.Run(ctx, getenv, stdout)
}
