package prestashop

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"

	"github.com/coinexport/export/services/shop-schema/internal/guard"
)

// Kind classifies what went wrong with a shop call.
type Kind int

// Kinds of shop failure. Each maps to one error code of the route.
const (
	KindUnauthorized Kind = iota + 1 // 401: key missing, wrong, or lacking a permission (also 405 code 25)
	KindForbidden                    // 403: key not enabled for this shop (code 132), or refused in front of the webservice (no code)
	KindNotAllowed                   // a redirect or a DNS answer led to a refused address
	KindUnreachable                  // DNS failure, connection refused or reset
	KindTLS                          // certificate or handshake failure
	KindTimeout                      // connect timeout or the whole call ran out of time
	KindBadResponse                  // not JSON, wrong shape, unexpected status
	KindTooLarge                     // an answer, its headers or the call's answers together over their cap, or too many rows
	KindDisabled                     // 503 code 22: webservice switched off
	KindUnavailable                  // any other 5xx, or a 429
	KindNotFound                     // no webservice answered at /api or dispatcher.php
	KindNotShopRoot                  // 400 code 27: base_url is not the shop's root (it ends in /api)
	KindShortage                     // this process could not open a connection: out of descriptors, memory or local ports
)

// reasonShortage is the reason of a KindShortage error.
const reasonShortage = "the service is short of resources"

// ShortageError is a KindShortage error of resource, err what failed for
// want of descriptors, memory or local ports, kept for the log: its text
// says which (EMFILE, ENOMEM, EADDRNOTAVAIL, …), and so whether nofile,
// memory or the connections' churn is to look at.
func ShortageError(resource string, err error) *Error {
	return &Error{Kind: KindShortage, Resource: resource, Reason: reasonShortage, err: err}
}

// CodeNotAllowed is the error code of an address the guard refuses, as a
// base_url (shopschema) or as a redirect's target here: one code, one
// place.
const CodeNotAllowed = "base_url_not_allowed"

// Code is the route's error code for a failure of kind k (README,
// "Errors"), and the error.type of the span of the shop request that
// failed so: one vocabulary for answers, logs, metrics and traces. It is
// "" for a kind it does not know.
func (k Kind) Code() string {
	switch k {
	case KindUnauthorized:
		return "shop_401"
	case KindForbidden:
		return "shop_403"
	case KindNotAllowed:
		return CodeNotAllowed
	case KindUnreachable:
		return "shop_unreachable"
	case KindTLS:
		return "shop_tls_error"
	case KindTimeout:
		return "shop_timeout"
	case KindBadResponse:
		return "shop_bad_response"
	case KindTooLarge:
		return "shop_too_large"
	case KindDisabled:
		return "shop_webservice_disabled"
	case KindUnavailable:
		return "shop_unavailable"
	case KindNotFound:
		return "shop_not_found"
	case KindNotShopRoot:
		return "invalid_base_url"
	case KindShortage:
		// The service's own shortage, as its answer says, not the shop's.
		return "unavailable"
	}
	return ""
}

// Error is a failed shop call. What a client is shown (Resource and Reason)
// is fixed phrases and the resource name only: never the shop's body, its
// headers, the request URL or the key. Error() adds the status code and the
// underlying error (a transport error, whose text holds the request URL, or
// the decoder's), freed of the key (keyFree), for the log only.
type Error struct {
	Kind     Kind
	Resource string // categories, product_features, ...
	Status   int    // HTTP status of the shop's answer, 0 when there was none
	Codes    []int  // PrestaShop error codes of the answer
	Reason   string // safe, fixed text
	err      error  // underlying transport or decoding error, for logs
	// foreign is set for an answer that is neither JSON nor a PrestaShop
	// error body: a page the webservice did not write (notWebservice).
	foreign bool
}

func (e *Error) Error() string {
	s := "shop " + e.Resource + ": " + e.Reason
	if e.Status != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

// Unwrap returns the transport error.
func (e *Error) Unwrap() error { return e.err }

// HasCode reports whether the shop answered with PrestaShop error code c.
func (e *Error) HasCode(c int) bool { return slices.Contains(e.Codes, c) }

// PrestaShop's codes for a key refused one resource, not the key as a
// whole: 26 (401) when the key has no permission on it, 25 (405) when it
// has others (POST, PUT, DELETE) but not GET.
const (
	codeResourceNotAllowed = 26
	codeMethodNotAllowed   = 25
)

// resourceRefused reports whether the shop refused the key one resource
// only (code 26 or 25).
func (e *Error) resourceRefused() bool {
	return e.Kind == KindUnauthorized && (e.HasCode(codeResourceNotAllowed) || e.HasCode(codeMethodNotAllowed))
}

// statusError classifies a non-2xx answer.
func statusError(resource string, status int, body []byte) *Error {
	e := &Error{Resource: resource, Status: status, Codes: shopErrors(body)}
	e.foreign = len(e.Codes) == 0 && !looksLikeJSON(body)
	switch {
	case status == 401 && len(e.Codes) == 0:
		// PrestaShop answers a request without a key with a bare
		// "401 Unauthorized" (not JSON, not XML): the header was lost on
		// the way to PHP, or a password in front of the shop asked first.
		e.Kind, e.Reason = KindUnauthorized, "the shop did not receive the key (is the Authorization header forwarded to PHP, or is the shop behind a password of its own?)"
	case status == 401 && e.HasCode(codeResourceNotAllowed),
		// A key with other permissions on the resource but not GET: the
		// merchant's to fix as the one above, not a shop misbehaving.
		status == 405 && e.HasCode(codeMethodNotAllowed):
		e.Kind, e.Reason = KindUnauthorized, "the key has no GET permission on this resource ("+permissionsNeeded+")"
	case status == 401:
		e.Kind, e.Reason = KindUnauthorized, "the shop rejected the key"+keyFault(e)
	case status == 403 && len(e.Codes) == 0:
		// PrestaShop's only 403 is code 132. One without any PrestaShop
		// error code came from in front of the webservice (a web
		// application firewall, a security module, a server rule refusing
		// /api or the client): telling the merchant to re-link the key to
		// the shop would send them after the wrong setting.
		e.Kind, e.Reason = KindForbidden, "the shop's server refused the request before the PrestaShop webservice read it (no PrestaShop error code: a firewall, a security module or a server rule)"
	case status == 403:
		e.Kind, e.Reason = KindForbidden, "the key is not enabled for this shop"
	case status == 400 && e.HasCode(27):
		// Every resource read exists in 1.7, 8 and 9: a webservice that
		// knows none of them was asked for another path. PrestaShop's back
		// office shows the webservice as https://shop/api/, and base_url
		// copied from there gives /api/api/<resource>, which the rewrite
		// rule hands the dispatcher as resource "api". The caller's to fix.
		e.Kind, e.Reason = KindNotShopRoot, "the shop's webservice does not know the resource asked for: base_url must be the shop's own address, without /api"
	case status == 503 && e.HasCode(22):
		e.Kind, e.Reason = KindDisabled, "the shop's webservice is disabled: enable it in the back office, under Advanced Parameters"
	case status == 404:
		e.Kind, e.Reason = KindNotFound, "no PrestaShop webservice at this address: base_url must be the shop's own address, its subfolder included"
	case status >= 500:
		e.Kind, e.Reason = KindUnavailable, "the shop answered with a server error"
	case status == 429:
		// The shop, or a CDN or firewall in front of it, limits how fast
		// it is read: passing, as a 5xx is, not a shop to fix, which
		// shop_bad_response ("fix the shop") told the caller.
		e.Kind, e.Reason = KindUnavailable, "the shop refused the request as one too many; retry later"
	default:
		e.Kind, e.Reason = KindBadResponse, "the shop answered with an unexpected status"
	}
	return e
}

// keyFault names, from PrestaShop's codes (reference §1.2), what is wrong
// with a key the shop refused: ": ..." or "".
func keyFault(e *Error) string {
	switch {
	case e.HasCode(18):
		return ": PrestaShop keys are 32 characters"
	case e.HasCode(20):
		// 20 ("not active") comes with 21 for a key the shop does not have
		// as well as for one it has disabled.
		return ": it is unknown to the shop, or disabled in its webservice settings"
	case e.HasCode(21):
		return ": it has no permission at all (" + permissionsNeeded + ")"
	}
	return ""
}

// bodyError classifies a failure to read the body of an answer whose
// status line and headers came. The shop was reached, so unless time ran
// out, the caller left or TLS failed, its answer is at fault: cut short
// (the connection closed or reset before the body's end) or not decodable
// (a Content-Encoding: gzip that is not gzip). That is shop_bad_response;
// shop_unreachable, as transportError names any other network error,
// sent the merchant to check DNS and firewalls.
func bodyError(ctx context.Context, resource string, status int, err error) *Error {
	e := transportError(ctx, resource, err)
	e.Status = status
	if e.Kind == KindUnreachable {
		e.Kind, e.Reason = KindBadResponse, "the shop's answer was cut short or could not be decoded"
	}
	return e
}

// transportError classifies an error from http.Client.Do or reading the
// body.
func transportError(ctx context.Context, resource string, err error) *Error {
	e := &Error{Resource: resource, err: err}
	var (
		certErr     *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
		recordErr   tls.RecordHeaderError
		netErr      net.Error
	)
	alert, alerted := remoteAlert(err)
	switch {
	case guard.Shortage(err):
		// Ours, not the shop's: shop_unreachable would send the merchant
		// to check DNS and firewalls, and the SRE to the shop.
		e.Kind, e.Reason = KindShortage, reasonShortage
	case errors.Is(err, guard.ErrNotAllowed):
		e.Kind, e.Reason = KindNotAllowed, "the shop's address or a redirect target is not allowed"
	case errors.Is(err, guard.ErrNotHTTPS):
		e.Kind, e.Reason = KindBadResponse, "the shop redirected to an http:// address: shops are read over https only (have the shop answer its webservice over https without redirecting to http)"
	case errors.Is(err, guard.ErrTooManyRedirects):
		e.Kind, e.Reason = KindBadResponse, fmt.Sprintf("the shop redirected more than %d times (a redirect loop?): set base_url to the shop's address after its redirects", guard.MaxRedirects)
	case errors.Is(err, guard.ErrInvalid):
		e.Kind, e.Reason = KindBadResponse, "the shop redirected to an invalid address"
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		e.Kind, e.Reason = KindTimeout, "the shop did not answer in time"
	case errors.Is(err, http.ErrSchemeMismatch):
		// net/http's name for a TLS record header that reads "HTTP/".
		e.Kind, e.Reason = KindTLS, "the shop's port does not speak TLS (plain HTTP answered)"
	case errors.As(err, &unknownAuth):
		e.Kind, e.Reason = KindTLS, "the shop's certificate is not signed by a trusted authority (self-signed, or its chain is incomplete): the shop needs one from a public certificate authority"
	case errors.As(err, &invalidErr) && invalidErr.Reason == x509.Expired:
		e.Kind, e.Reason = KindTLS, "the shop's certificate has expired, or is not valid yet: renew it, or check the server's clock"
	case errors.As(err, &hostErr):
		e.Kind, e.Reason = KindTLS, "the shop's certificate is for another name than base_url's host: use the name the certificate is for, or one for this name"
	case errors.As(err, &certErr), errors.As(err, &invalidErr), errors.As(err, &recordErr):
		e.Kind, e.Reason = KindTLS, "TLS with the shop failed (its certificate is not valid for a server, or its port does not speak TLS)"
	case goSays(err, serverPickedOldTLS):
		e.Kind, e.Reason = KindTLS, reasonOldTLS
	case alerted:
		// A server that refused the handshake was shop_unreachable
		// ("check DNS and firewalls"), and then every alert read "no TLS
		// version or cipher suite in common".
		e.Kind, e.Reason = KindTLS, alertReason(alert)
	case errors.As(err, &netErr) && netErr.Timeout():
		e.Kind, e.Reason = KindTimeout, "the shop did not answer in time"
	default:
		e.Kind, e.Reason = answerFault(err)
	}
	return e
}

// answerFault classifies a failure of an answer's protocol, HTTP/1.1 or
// HTTP/2, after TLS. The shop answered: none of them is shop_unreachable,
// which sends the merchant to check DNS and firewalls, but a connection
// closed or reset before an answer came.
func answerFault(err error) (Kind, string) {
	if kind, reason, ok := http2Fault(err); ok {
		return kind, reason
	}
	switch {
	case goSays(err, headersTooLarge):
		return KindTooLarge, reasonHeadersTooLarge
	case malformedHTTP1(err):
		return KindBadResponse, "the shop's server answered what is not HTTP (a status line or header that does not parse)"
	case framingUnreadable(err):
		return KindBadResponse, "the shop's server answered a body whose length cannot be read (a Content-Length that is not a number, two that differ, or a Transfer-Encoding other than chunked)"
	}
	return KindUnreachable, "the shop could not be reached"
}
