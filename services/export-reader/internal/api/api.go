// Package api is the HTTP side of the export reader: it decodes and checks
// the request, calls the export package, and writes the envelope of spec 2.1
// by appending the pre-rendered items' bytes.
package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/services/export-reader/internal/export"
)

// API serves the export routes.
type API struct {
	reader       *export.Reader
	log          *slog.Logger
	queryTimeout time.Duration
	dsnSetting   string // READ_DATABASE_URL or DATABASE_URL, as the log's causes name it
	// signatureLog holds back cursor-signature warnings to one per
	// interval: a reader with the wrong secret refuses every cursor
	// another reader signed.
	signatureLog logging.Throttle
}

// signatureLogInterval is how often at most a cursor-signature warning is
// logged.
const signatureLogInterval = 10 * time.Second

// New returns the API over reader. queryTimeout bounds each request's
// database work; dsnSetting names the variable reader's pool came from
// (READ_DATABASE_URL, else DATABASE_URL), which the log's causes name.
func New(reader *export.Reader, log *slog.Logger, queryTimeout time.Duration, dsnSetting string) *API {
	return &API{reader: reader, log: log, queryTimeout: queryTimeout, dsnSetting: dsnSetting, signatureLog: logging.Throttle{Interval: signatureLogInterval}}
}

// Register lists every route of the service (spec 4.3, 4.4). The gateway
// forwards the full original path.
func (a *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/export/items", a.list)
	mux.HandleFunc("GET /v1/export/items/{item_id}", a.item)
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	owner, err := caller(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	q, err := parseList(r.URL.RawQuery)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	q.OwnerID, q.HeadOnly = owner, r.Method == http.MethodHead
	ctx, cancel := context.WithTimeout(r.Context(), a.queryTimeout)
	defer cancel()
	buf := getBuffer()
	defer putBuffer(buf)
	body := append(buf.b, `{"data":[`...)
	body, next, err := a.reader.AppendPage(ctx, body, q)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	requestID := httpserver.RequestID(r)
	body = append(envelope.AppendMeta(append(body, ']'), requestID, true, next), '}')
	buf.b = body
	writeJSON(w, r, requestID, body)
}

func (a *API) item(w http.ResponseWriter, r *http.Request) {
	owner, err := caller(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	// A 404 traced by its request id says which item was missing.
	httpserver.AnnotateClientValue(w, r, "item_id", r.PathValue("item_id"))
	lang, err := parseItem(r.URL.RawQuery)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.queryTimeout)
	defer cancel()
	buf := getBuffer()
	defer putBuffer(buf)
	body := append(buf.b, `{"data":`...)
	body, err = a.reader.AppendItem(ctx, body, owner, r.PathValue("item_id"), lang)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	requestID := httpserver.RequestID(r)
	body = append(envelope.AppendMeta(body, requestID, false, ""), '}')
	buf.b = body
	writeJSON(w, r, requestID, body)
}

var (
	errNoKey   = errors.New("api: no API key")
	errNoScope = errors.New("api: key lacks export:read")
)

// caller returns the owner of the call, checking the scope again even though
// the gateway did: a service trusts the signed identity, not the route table.
func caller(r *http.Request) (string, error) {
	id, ok := identity.FromContext(r.Context())
	if !ok || id.Anonymous() {
		return "", errNoKey
	}
	if !id.HasScope(identity.ScopeExportRead) {
		return "", errNoScope
	}
	return id.OwnerID, nil
}
