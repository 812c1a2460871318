package httpserver

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// Out of file descriptors, a service logs the shortage once (acceptretry),
// not net/http's "Accept error" once a second for as long as it lasts, and
// serves the connection that waited once a descriptor is free.
func TestOutOfDescriptorsIsLoggedOnceAndServedAfter(t *testing.T) {
	var logs testenv.Output
	addr, stop := runServer(t, http.NewServeMux(), nil, slog.New(slog.NewJSONHandler(&logs, nil)), time.Second)
	t.Cleanup(func() { stop() })
	testenv.AnsweredAfterADescriptorShortage(t, addr, "/healthz", &logs)
	if strings.Contains(logs.String(), "Accept error") {
		t.Errorf("net/http logged its own accept errors too:\n%s", logs.String())
	}
}
