// Package shopschema is the logic of POST /v1/sync/prestashop/schema:
// validate the shop address and key, read the shop's schema through the
// guarded PrestaShop client, and shape it for a sale module (spec 2.6).
package shopschema

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/percent"
	"github.com/coinexport/export/services/shop-schema/internal/guard"
	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
)

// Error codes of invalid input (spec 7); all are answered with 400.
const (
	CodeInvalidBaseURL  = "invalid_base_url"
	CodeMustBeHTTPS     = "base_url_must_be_https"
	CodeNotAllowed      = prestashop.CodeNotAllowed
	CodeMissingWSKey    = "missing_ws_key"
	CodeInvalidBody     = "invalid_body"
	CodeInvalidParam    = "invalid_parameter"
	maxValuesPerFeature = 5000 // spec 8
	maxKeyLength        = 256
)

// InputError is a request the service refuses before calling the shop. Its
// message is fixed text that at most names the IP address or port written
// in base_url; it never repeats base_url or ws_key.
type InputError struct {
	Code    string
	Message string
}

func (e *InputError) Error() string { return e.Code + ": " + e.Message }

// Request is the body of the route.
type Request struct {
	BaseURL string
	WSKey   string
}

// Shop reads a shop's schema; *prestashop.Client implements it.
type Shop interface {
	ReadSchema(ctx context.Context, base *url.URL, key string) (*prestashop.Schema, error)
}

// Service answers the route.
type Service struct {
	guard    *guard.Guard
	resolver guard.Resolver
	shop     Shop
	timeout  time.Duration
}

// New returns a Service. timeout bounds one whole schema read.
func New(g *guard.Guard, r guard.Resolver, shop Shop, timeout time.Duration) *Service {
	return &Service{guard: g, resolver: r, shop: shop, timeout: timeout}
}

// Read validates req, reads the shop and returns the schema. Errors are
// *InputError, *prestashop.Error, or the request's cancellation during the
// shop's DNS lookup (its caller hung up, or a stopping server's drain cut
// it off).
func (s *Service) Read(ctx context.Context, req Request) (*Result, error) {
	if holdsAPIKey(req.BaseURL) {
		// Sent, the key would be in the URL of every shop request: in the
		// shop's access log, our client spans' url.full, and the WARN of a
		// call that fails; in its host name, also in the DNS queries.
		return nil, errAPIKeyInBaseURL
	}
	target, err := s.guard.ParseBaseURL(req.BaseURL)
	if err != nil {
		return nil, inputError(err)
	}
	if apikey.HostHoldsKeySecret(target.Host) {
		// The host as IDNA maps it ("ｃｘｒ－…" is "cxr-…"), before its lookup.
		return nil, errAPIKeyInBaseURL
	}
	key := strings.TrimSpace(req.WSKey)
	if key == "" {
		return nil, &InputError{CodeMissingWSKey, "ws_key is required: a non-empty string"}
	}
	if len(key) > maxKeyLength {
		return nil, &InputError{CodeInvalidBody, "ws_key is too long"}
	}
	if strings.ContainsFunc(key, unicode.IsControl) {
		// No webservice key holds one, and one in the key's middle hid it
		// from the redaction of what a shop echoes: a header line ends at
		// a line break, so a shop writing the key back in one quoted only
		// the part before it, and Go quotes the rest escaped (\x00).
		return nil, &InputError{CodeInvalidBody, "ws_key must not hold a control character (a line break, a tab, a NUL): no webservice key does"}
	}
	if apikey.ContainsKeySecret(key) {
		// The two keys mixed up: sent, ours would reach the shop's server
		// as the Basic user of every request.
		return nil, &InputError{CodeInvalidBody,
			"ws_key holds an API key of this service, not the shop's webservice key: it is never sent to a shop; revoke it, as it may have been logged on its way here"}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.guard.CheckResolved(ctx, s.resolver, target); err != nil {
		return nil, resolveError(err)
	}
	schema, err := s.shop.ReadSchema(ctx, target.URL, key)
	if err != nil {
		return nil, err
	}
	return build(schema), nil
}

// errAPIKeyInBaseURL refuses a base_url that holds one of our API keys.
var errAPIKeyInBaseURL = &InputError{CodeInvalidBaseURL,
	"base_url holds an API key of this service: it is never sent to a shop; revoke it, as it may have been logged on its way here"}

// holdsAPIKey reports whether base_url holds an API key of this service,
// or a key's secret with its checksum cut off or mistyped
// (apikey.ContainsKeySecret), as sent or %-decoded, or, in its host name,
// spelt as a host name can hold one (apikey.HostHoldsKeySecret: "cxr-…").
// Read as a path, each part of the URL is searched decoded as often as a
// key could hide in it.
func holdsAPIKey(baseURL string) bool {
	raw := strings.TrimSpace(baseURL)
	if apikey.PathHoldsKey(raw) || apikey.ContainsKeySecret(raw) || apikey.ContainsKeySecret(percent.DecodeLeniently(raw)) {
		return true
	}
	u, err := url.Parse(raw)
	return err == nil && apikey.HostHoldsKeySecret(u.Hostname())
}

// Host returns the host of req's base_url, for logs: the ASCII host of a
// URL the guard accepts, and for one it refuses the host as sent, so that
// an operator sees which address a refused call aimed at (a private
// address, a host off the allow-list). "" when there is none to tell, when
// the URL carries user info (PrestaShop takes the key as a Basic user, and
// a host parsed around it could hold part of one), when the host is not a
// plain name or address (it could hold anything, a key included), or when
// it holds req's key (a subdomain of it: the client spans withhold it too).
// A label that looks like one of our API keys is "[key]"
// (apikey.RedactKeyLikeHost), as the client spans record it.
func (s *Service) Host(req Request) string {
	host := s.host(req.BaseURL)
	if prestashop.HoldsKey(host, strings.TrimSpace(req.WSKey)) {
		return ""
	}
	return apikey.RedactKeyLikeHost(host)
}

func (s *Service) host(baseURL string) string {
	if t, err := s.guard.ParseBaseURL(baseURL); err == nil {
		return t.Host
	}
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || u.User != nil || strings.Contains(u.Host, "@") {
		return ""
	}
	host := u.Hostname()
	if !plainHost(host) {
		// url.Parse lets "&ws_key=…" or a zone ("%25…") into a host: a
		// client that wrote & for ? would have its key logged.
		return ""
	}
	return host
}

// plainHost reports whether host is an IP address without a zone, or a
// DNS name of letters, digits, dots and hyphens (at most 253 bytes), the
// only hosts a refused URL's log line names.
func plainHost(host string) bool {
	if addr, err := netip.ParseAddr(host); err == nil {
		return addr.Zone() == ""
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

func inputError(err error) *InputError {
	msg := err.Error()
	switch {
	case errors.Is(err, guard.ErrNotHTTPS):
		return &InputError{CodeMustBeHTTPS, msg}
	case errors.Is(err, guard.ErrNotAllowed):
		return &InputError{CodeNotAllowed, msg}
	}
	return &InputError{CodeInvalidBaseURL, msg}
}

func resolveError(err error) error {
	switch {
	case errors.Is(err, guard.ErrNotAllowed):
		// Not guard's message, which names the address: it came from our
		// DNS, not from the client, and would map internal names for a
		// stranger.
		return &InputError{CodeNotAllowed, "base_url resolves to an address that is not allowed"}
	case errors.Is(err, guard.ErrNoSuchHost):
		// The caller can fix it (spec 4.2's 400): a 5xx would tell it to
		// retry an address that names no host.
		return &InputError{CodeInvalidBaseURL, "base_url's host name does not exist (DNS: no such host)"}
	case guard.Shortage(err):
		// Ours, not the shop's DNS: answered as a connection this process
		// could not open.
		return prestashop.ShortageError("host", err)
	case errors.Is(err, guard.ErrUnresolvable):
		return &prestashop.Error{Kind: prestashop.KindUnreachable, Resource: "host", Reason: "the shop's host name could not be resolved (DNS failed)"}
	case errors.Is(err, context.Canceled):
		// The caller hung up, or the drain cut the read off, during the
		// lookup: kept as it is, so that it is answered as such
		// (httpserver.CallerGone, httpserver.CutOff), not as a slow shop.
		return err
	}
	return &prestashop.Error{Kind: prestashop.KindTimeout, Resource: "host", Reason: "the shop's host name did not resolve in time"}
}
