// Command plainhop is make bench's reference hop: Fiber's own proxy
// middleware in front of one upstream and nothing else (no keys, limits,
// tracing, signing or timeouts), as a team would write it in twenty lines.
// The bench measures it beside nginx and the gateway, so each run shows what
// a plain Fiber proxy hop costs on the machine of the day. Not for
// production.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/stopsignal"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/proxy"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "plainhop:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	app := newApp(cfg.upstream)

	ctx, stop := stopsignal.Context()
	defer stop()
	go func() {
		<-ctx.Done()
		_ = app.Shutdown()
	}()
	return app.Listen(cfg.listen)
}

// config is plainhop's command line.
type config struct {
	listen   string // address to listen on
	upstream string // base URL every request is relayed to
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("plainhop", flag.ContinueOnError)
	var cfg config
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:18085", "address to listen on")
	fs.StringVar(&cfg.upstream, "upstream", "", "upstream base URL, e.g. http://127.0.0.1:18081")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if cfg.upstream == "" {
		return config{}, errors.New("--upstream is required")
	}
	return cfg, nil
}

// newApp is the whole hop, as run serves it and the tests drive it: every
// request relayed to upstream with its path and query, failures answered by
// answerError.
func newApp(upstream string) *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: answerError})
	app.Use(func(c *fiber.Ctx) error { return proxy.Do(c, upstream+c.OriginalURL()) })
	return app
}

// answerError answers a failed hop with the API's error envelope and a
// request id of its own (in meta and X-Request-Id), as every process of the
// stack does.
func answerError(c *fiber.Ctx, err error) error {
	status, code := fiber.StatusBadGateway, "bad_gateway"
	var fe *fiber.Error
	if errors.As(err, &fe) && fe.Code < 500 {
		status, code = fe.Code, "bad_request"
	}
	id := httpserver.RandomRequestID()
	c.Set(fiber.HeaderContentType, envelope.ContentType)
	c.Set(fiber.HeaderCacheControl, envelope.ErrorCacheControl)
	c.Set(envelope.RequestIDHeader, id)
	// A fixed message: the error names internal addresses.
	return c.Status(status).Send(envelope.ErrorBytes(code, "plainhop: the request could not be relayed", id))
}
