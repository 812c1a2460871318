package edge

import (
	"bytes"
	"encoding/hex"
	"errors"
	"iter"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// forwardedHeaders are the only client headers a service receives; every
// other one (the API key, identity or internal headers, hop-by-hop headers,
// cookies, forwarding headers) is dropped, so nothing a client sends can
// pose as something the gateway vouches for. Keys are lower case.
var forwardedHeaders = map[string]bool{
	"accept": true, "accept-encoding": true, "accept-language": true,
	"content-type": true, "content-length": true, "idempotency-key": true,
	"user-agent": true, "if-none-match": true, "if-modified-since": true,
	"host": true, // replaced with the instance's address
}

// ownOnTheWay are the forwarded fields of which a service gets the
// gateway's, not the client's: the request sent on is framed and
// addressed by the gateway (fasthttp writes its length and the instance's
// Host), so a client that names them in Connection changes nothing.
var ownOnTheWay = map[string]bool{"host": true, "content-length": true}

// prepareUpstreamRequest makes the client's request the one a service
// gets: only the forwarded headers, X-Forwarded-For and the signed
// identity for uri, the path and query as sent, signed by signer (the
// upstream's: signerFor). It refuses a compressed body (errEncodedBody).
func (g *Gateway) prepareUpstreamRequest(req *fasthttp.Request, rq *request, uri string, signer *identity.Signer) error {
	// Once scrubbed, the request holds none of the headers set below, so
	// they are added, without the search for one to replace that Set does.
	if encoded := scrubHeaders(&req.Header); encoded && len(req.Body()) > 0 {
		return errEncodedBody
	}
	// fasthttp writes "Content-Type: application/octet-stream" for a body
	// sent without one; the service would refuse that type, not the missing
	// one (Python requests' data= with a string sends none), and shop-schema,
	// which reads any, would log a type no client sent.
	req.Header.SetNoDefaultContentType(true)
	req.Header.Add(fiber.HeaderXForwardedFor, rq.clientIP)
	signer.SignInto(req.Header.AddBytesV, identity.Identity{OwnerID: rq.key.OwnerID, PlatformID: rq.key.PlatformID,
		KeyID: rq.key.ID, Scopes: rq.key.Scopes, RequestID: rq.id}, signedRequest(rq.method, &req.Header, uri), time.Now())
	return nil
}

// inHTTP11 makes the request one in HTTP/1.1 for its way to the service and
// returns what gives it back the client's version. Sent on in the client's
// HTTP/1.0, a request made the service's net/http answer in 1.0 and close
// the connection: each one cost a kept-alive connection to the service, a
// new one dialled and a connection the service left in TIME_WAIT, however
// cheap it was for the client (HTTP/1.0 with Connection: keep-alive,
// pipelined); so did every request of a proxy in front that speaks
// HTTP/1.0 (nginx's default proxy_http_version).
//
// The client's answer does not hang on the restore: fasthttp (v1.78,
// server.go) takes the version and the keep-alive decision that frame it
// (no chunked coding for HTTP/1.0, the connection closed unless asked to
// stay) before it calls the handler, and
// TestServicesAreSpokenToInHTTP11WhateverTheClientSpoke passes without it.
// It keeps the request as the client sent it for whatever reads it after
// the call.
func inHTTP11(h *fasthttp.RequestHeader) (restore func()) {
	if h.IsHTTP11() {
		return func() {}
	}
	client := string(h.Protocol()) // a copy: SetProtocol reuses the buffer
	h.SetProtocol("HTTP/1.1")
	return func() { h.SetProtocol(client) }
}

// errIdentityRefused is a service's 401. The gateway has already checked
// the key, so the service refused the identity the gateway signed: the
// fault is ours, and relaying the 401 would send the client to rotate a
// valid key.
var errIdentityRefused = errors.New("the service refused the gateway's signed identity: " +
	"IDENTITY_SECRET differs between the gateway and the service (shop-schema's: the gateway's SHOP_SCHEMA_IDENTITY_SECRET), " +
	"their clocks differ by more than identity.MaxSkew, " +
	"something between them rewrote the request's method, path, query or Idempotency-Key, " +
	"or the service is of a build before identity-v2 (upgrade services first: README, Upgrading to identity-v2)")

// signedRequest is the request the identity is signed for: method as sent
// (proxy passes rq.method, which httpserver.StableMethod keeps as a constant: only a
// routed method is proxied), requestURI as upstream.Do sends it
// (the service reads the same bytes as its RequestURI) and the
// Idempotency-Key, so that the signature opens no other request.
func signedRequest(method string, h *fasthttp.RequestHeader, requestURI string) identity.Request {
	if method == httpserver.MethodOther { // never proxied; the bytes as sent, all the same
		method = string(h.Method())
	}
	r := identity.Request{Method: method, Target: requestURI}
	if key := h.Peek(idempotencyKeyHeader); len(key) > 0 {
		r.IdempotencyKey = string(key)
	}
	return r
}

const idempotencyKeyHeader = "Idempotency-Key"

// signerFor is the signer of the identity sent to the upstream named up:
// shop-schema's has a secret of its own, so that shop-schema, which talks
// to merchants' servers, holds none that export-reader or sales-writer
// accept.
func (g *Gateway) signerFor(up string) *identity.Signer {
	if up == upstreamShopSchema {
		return g.shopSchemaSigner
	}
	return g.signer
}

// renewIdentity signs again with signer, at the time of a repeat, the
// identity proxy signed: a sale repeated after a whole
// UPSTREAM_READ_TIMEOUT would otherwise reach the second instance with a
// signature the service may find too old (identity.MaxSkew), and the
// client would get a 401 for a valid key.
func (g *Gateway) renewIdentity(signer *identity.Signer, h *fasthttp.RequestHeader, requestURI string) {
	get := func(name string) string { return string(h.Peek(name)) }
	if err := signer.Renew(get, signedRequest(string(h.Method()), h, requestURI), h.SetBytesV, time.Now()); err != nil {
		// Only if the headers were not the ones proxy signed: a bug. The
		// request id is the signed one, for the SRE who greps for it.
		g.log.Error("could not renew the identity of a repeated request", "error", err,
			"request_id", get(identity.HeaderRequestID))
	}
}

// receivedRequestURI is the path and query as the client sent them, copied:
// the services route on the same raw segments as the gateway did (checkPath
// keeps out what they would read otherwise). Not req.RequestURI(), which
// fasthttp rebuilds from the decoded, dot-resolved path once the URI is
// parsed: "a%2F..%2F..%2Fitems" matched the item route here and reached the
// list there.
func receivedRequestURI(u *fasthttp.URI) string {
	var buf [256]byte // longer ones spill to the heap
	b := append(buf[:0], u.PathOriginal()...)
	if query := u.QueryString(); len(query) > 0 {
		b = append(append(b, '?'), query...)
	}
	return string(b)
}

// addTraceContext adds the W3C trace context of sc (traceparent, and
// tracestate if any), which the services' propagator reads. Written here
// rather than by the global propagator's Inject, which costs an allocation
// and a header search per request. Baggage is not forwarded: the gateway
// starts each trace, and trusts no client's baggage.
func addTraceContext(h *fasthttp.RequestHeader, sc trace.SpanContext) {
	if !sc.IsValid() {
		return
	}
	var buf [55]byte // 00-{32 hex}-{16 hex}-{2 hex}
	tid, sid := sc.TraceID(), sc.SpanID()
	b := append(buf[:0], "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, []byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))}) // as Inject writes them
	h.AddBytesV(headerTraceparent, b)
	if ts := sc.TraceState(); ts.Len() > 0 {
		h.Add(headerTracestate, ts.String())
	}
}

// The W3C trace-context headers.
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

// scrubHeaders deletes every header of the header section outside
// forwardedHeaders, each one a Connection field names as an option
// (RFC 9110 7.6.1: a field for the hop to the gateway alone; misreadHead
// has refused those that change a request's meaning,
// refuseEndToEndOptions), and cookies, and reports whether a
// Content-Encoding other than identity was sent (it visits every header
// anyway, so the check costs no search of its own). All does not visit
// fasthttp's trailer section, which Peek reads after the header section:
// the scrub is whole because misreadHead refused every request with
// trailer fields.
// The names to drop are gathered first (fasthttp's headers cannot change
// while visited) into one buffer, without an allocation per header.
func scrubHeaders(h *fasthttp.RequestHeader) (encoded bool) {
	var (
		lowerBuf [64]byte
		namesBuf [256]byte
		ends     [16]int
	)
	names, drop := namesBuf[:0], ends[:0]
	for k, v := range h.All() {
		lower := appendLower(lowerBuf[:0], k)
		if string(lower) == "content-encoding" && !noCoding(v) {
			encoded = true // each of the header's lines is seen here
		}
		if !forwardedHeaders[string(lower)] {
			names = append(names, k...)
			drop = append(drop, len(names))
			if string(lower) == "connection" {
				names, drop = appendForwardedOptions(names, drop, v)
			}
		}
	}
	from := 0
	for _, to := range drop {
		h.DelBytes(names[from:to])
		from = to
	}
	// Cookies are kept apart from the other headers by fasthttp.
	h.DelAllCookies()
	return encoded
}

// appendForwardedOptions appends to names, and their ends to drop, the
// options of a Connection field's value that name a forwarded field
// (DelBytes finds a name in any case); the usual keep-alive or close is
// looked up and left.
func appendForwardedOptions(names []byte, drop []int, value []byte) ([]byte, []int) {
	var lowerBuf [32]byte
	for option := range connectionOptions(value) {
		lower := appendLower(lowerBuf[:0], option)
		if forwardedHeaders[string(lower)] && !ownOnTheWay[string(lower)] {
			names = append(names, option...)
			drop = append(drop, len(names))
		}
	}
	return names, drop
}

// connectionOptions yields the options of a Connection field's value, a
// comma-separated list of field names and tokens (RFC 9110 7.6.1), without
// the spaces or tabs around them; empty elements are skipped (RFC 9110
// 5.6.1 lets a recipient ignore them).
func connectionOptions(value []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for option := range bytes.SplitSeq(value, []byte(",")) {
			if option = trimBlanks(option); len(option) > 0 && !yield(option) {
				return
			}
		}
	}
}

// noCoding reports whether a Content-Encoding value names no coding:
// identity, or nothing.
func noCoding(v []byte) bool {
	v = bytes.TrimSpace(v)
	return len(v) == 0 || bytes.EqualFold(v, []byte("identity"))
}

// appendLower appends ASCII-lowercased b to dst.
func appendLower(dst, b []byte) []byte {
	for _, ch := range b {
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		dst = append(dst, ch)
	}
	return dst
}
