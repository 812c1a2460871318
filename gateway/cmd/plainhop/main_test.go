package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/proxy"
)

// A hop whose upstream refuses the connection answers 502 with the error
// envelope, and its request id is in meta and in X-Request-Id.
func TestFailedHopAnswersTheEnvelopeWithARequestID(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now

	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: answerError})
	app.Use(func(c *fiber.Ctx) error { return proxy.Do(c, refused+c.OriginalURL()) })
	resp, err := app.Test(httptest.NewRequest("GET", "/v1/export/items/x", nil), -1)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != fiber.StatusBadGateway {
		t.Errorf("status = %d, want 502; body %s", resp.StatusCode, body)
	}
	var env struct {
		Error struct{ Code, Message string }
		Meta  struct {
			RequestID string `json:"request_id"`
		}
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("body is not the envelope: %v: %s", err, body)
	}
	if env.Error.Code != "bad_gateway" || env.Error.Message == "" {
		t.Errorf("error = %+v, want code bad_gateway and a message", env.Error)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(env.Meta.RequestID) {
		t.Errorf("meta.request_id = %q, want 32 hex digits", env.Meta.RequestID)
	}
	if got := resp.Header.Get(envelope.RequestIDHeader); got != env.Meta.RequestID {
		t.Errorf("%s = %q, want meta.request_id %q", envelope.RequestIDHeader, got, env.Meta.RequestID)
	}
}

// A client error Fiber raises keeps its 4xx status.
func TestClientErrorsKeepTheirStatus(t *testing.T) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: answerError})
	app.Use(func(c *fiber.Ctx) error { return fiber.NewError(fiber.StatusRequestEntityTooLarge, "too large") })
	resp, err := app.Test(httptest.NewRequest("POST", "/", nil), -1)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != fiber.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", resp.StatusCode)
	}
	if resp.Header.Get(envelope.RequestIDHeader) == "" {
		t.Error("no request id on a client error")
	}
}
