package prestashop

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/percent"
)

// The key travels only in the Authorization header, so the URLs this client
// writes carry no secret. A shop's redirect can: its Location is the shop's
// to choose, and one that puts ws_key (or the key anywhere) into it would
// have it copied into the error chain we log and into the client span's
// url.full. Every URL that leaves this package for a log or a span goes
// through redactURL first.

// sentParams are the query parameters this client writes; their values are
// its own. Any other parameter is the shop's.
var sentParams = map[string]bool{
	"url": true, "output_format": true, "display": true, "sort": true, "limit": true, "filter[custom]": true,
}

// redacted replaces what is not shown, as OpenTelemetry's semantic
// conventions write it for url.full.
const redacted = "REDACTED"

// redactURL returns raw without user info or fragment, each query parameter
// that this client did not write replaced by REDACTED (name and value: a
// name can be the secret too), and the key, wherever it still appears,
// replaced as well. "Wherever" includes the forms a shop that writes a
// redirect's URL could give it: %-encoded (%41%42…, which url.String
// keeps as written), in another letter case (PrestaShop's keys are upper
// case, and a lower-case copy is the key all the same), or as the Basic
// credential it was sent as; a host, path segment or parameter value that
// holds it in any of these forms is replaced whole.
func redactURL(raw, key string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redacted
	}
	u.User, u.Fragment, u.RawFragment = nil, "", ""
	if HoldsKey(u.Host, key) {
		u.Host = redacted
	}
	redactKeyLikeHost(u)
	redactPath(u, key)
	redactKeyLikePath(u)
	if u.RawQuery != "" {
		params := strings.Split(u.RawQuery, "&")
		for i, p := range params {
			name, value, _ := strings.Cut(p, "=")
			if unescaped, err := url.QueryUnescape(name); err != nil || !sentParams[unescaped] {
				params[i] = redacted
			} else if v, err := url.QueryUnescape(value); err != nil || HoldsKey(v, key) || HoldsKey(value, key) {
				// value as written too: QueryUnescape reads '+' as a space,
				// which a key or its Basic credential can hold.
				params[i] = name + "=" + redacted
			}
		}
		u.RawQuery = strings.Join(params, "&")
	}
	s := replaceKey(u.String(), key)
	if HoldsKey(s, key) {
		// A key across parts (host and path: https://AB/CD...) that
		// String escaped anew, or any form the parts did not show.
		return redacted
	}
	return s
}

// redactPath replaces each segment of u's path that holds the key, decoded,
// with REDACTED; the whole path, if the key spans segments (a key with a
// '/' in it).
func redactPath(u *url.URL, key string) {
	if !HoldsKey(u.Path, key) {
		return
	}
	segments := strings.Split(u.EscapedPath(), "/")
	for i, s := range segments {
		if decoded, err := url.PathUnescape(s); err != nil || HoldsKey(decoded, key) {
			segments[i] = redacted
		}
	}
	escaped := strings.Join(segments, "/")
	if path, err := url.PathUnescape(escaped); err == nil && !HoldsKey(path, key) {
		u.Path, u.RawPath = path, escaped
		return
	}
	u.Path, u.RawPath = "/"+redacted, ""
}

// redactKeyLikePath replaces the segments of u's path that look like an
// API key of this service (apikey.RedactKeyLikePath, "[key]"). A base_url
// holding a key is refused before any call (shopschema.Service.Read), but
// a key mistyped or cut short is no key and is sent: the URL would
// record most of a secret in url.full and in the logged error chain.
func redactKeyLikePath(u *url.URL) {
	escaped := u.EscapedPath()
	redactedPath := apikey.RedactKeyLikePath(escaped)
	if redactedPath == escaped {
		return
	}
	if path, err := url.PathUnescape(redactedPath); err == nil {
		u.Path, u.RawPath = path, redactedPath
		return
	}
	u.Path, u.RawPath = "/"+redacted, ""
}

// redactKeyLikeHost replaces the labels of u's host that look like an API
// key of this service (apikey.RedactKeyLikeHost, "[key]"), its port kept. A
// base_url whose host holds a key's whole secret is refused before any
// lookup (shopschema.Service.Read); a key cut short in a host name is sent,
// and a redirect's host is the shop's to write.
func redactKeyLikeHost(u *url.URL) {
	host, port := u.Hostname(), u.Port()
	if redactedHost := apikey.RedactKeyLikeHost(host); redactedHost != host {
		u.Host = redactedHost
		if port != "" {
			u.Host += ":" + port
		}
	}
}

// redactKeyLikeHosts replaces, in an error's text, the labels that look like
// an API key of this service in every run of a host name's characters
// (apikey.RedactKeyLikeHost): Go quotes the host it asked for in its
// errors ("x509: certificate is valid for shop.example, not cxr-…",
// "lookup cxr-…: no such host").
func redactKeyLikeHosts(text string) string {
	if !apikey.ContainsKeyLike(text) {
		return text
	}
	hostChar := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_'
	}
	var b strings.Builder
	for len(text) > 0 {
		end := strings.IndexFunc(text, func(r rune) bool { return !hostChar(r) })
		if end < 0 {
			end = len(text)
		}
		b.WriteString(apikey.RedactKeyLikeHost(text[:end]))
		rest := text[end:]
		next := strings.IndexFunc(rest, hostChar)
		if next < 0 {
			next = len(rest)
		}
		b.WriteString(rest[:next])
		text = rest[next:]
	}
	return b.String()
}

// HoldsKey reports whether decoded text s holds the key, in any letter
// case, or the Basic credential it is sent as (base64 of "key:"), also
// once s is %-decoded again (the one rule for every text logged or put in
// a span, shopschema's shop_host too): a shop can encode the key more than once
// (%2541 is %41 is A). Text that still decodes after maxDecodings more is
// taken to hold it: only a shop hiding something writes that.
func HoldsKey(s, key string) bool {
	if key == "" {
		return false
	}
	forms := secretForms(key)
	for i, form := range forms {
		forms[i] = strings.ToLower(form)
	}
	return percent.HoldsDecoded(s, maxDecodings, func(s string) bool {
		lower := strings.ToLower(s)
		return slices.ContainsFunc(forms, func(form string) bool { return strings.Contains(lower, form) })
	})
}

// secretForms are the texts that are the key: the key, the Basic
// credential it is sent as, and, for a key holding what Go escapes when it
// quotes (a control character, '"', a backslash, a character that is not
// printable), the key as strconv.Quote writes it, once and twice, and in
// ASCII: net/http and net/url quote what a shop sent that does not parse
// (a header line, a Location), and a key written back there reached the
// error's text escaped (\x7f, \t, \"), where the key as sent is not
// found. Quoted twice: a quoted text quoted again, as a JSON log line
// writes it.
func secretForms(key string) []string {
	forms := []string{key, basicCredential(key)}
	// A key with nothing to escape (a PrestaShop key: 32 letters and
	// digits) is quoted as it is: its quoted forms are the key, and
	// making them for every URL a span records tripled redactURL's time.
	if unquoted(strconv.QuoteToASCII(key)) == key {
		return forms
	}
	for _, quote := range []func(string) string{strconv.Quote, strconv.QuoteToASCII} {
		once := unquoted(quote(key))
		forms = append(forms, once, unquoted(quote(once)))
	}
	slices.Sort(forms)
	return slices.Compact(forms)
}

// unquoted is a quoted string without its surrounding quotes.
func unquoted(quoted string) string { return quoted[1 : len(quoted)-1] }

// maxDecodings is how many more times HoldsKey %-decodes a text.
const maxDecodings = 3

// basicCredential is the key as its Authorization: Basic header carries it.
func basicCredential(key string) string { return base64.StdEncoding.EncodeToString([]byte(key + ":")) }

// redactErrorURL rewrites the URL of the *url.Error in err's chain (the
// one http.Client.Do returns, which quotes the URL it failed on) with
// redactURL.
func redactErrorURL(err error, key string) {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = redactURL(ue.URL, key)
	}
}

// keyFree returns err with the key taken out of its text, which is logged
// (the WARN line "shop call failed"): the URL of its *url.Error is
// redacted as redactURL does, and the text is searched again, since a
// transport error can quote what the shop sent (net/http quotes a
// malformed status line, "malformed HTTP status code \"<bytes>\""), where a
// shop could write back the key it received. The chain is kept for
// errors.Is and errors.As.
func keyFree(err error, key string) error {
	redactErrorURL(err, key)
	return &keyFreeError{text: bounded(redactKeyLikeHosts(redactText(err.Error(), key))), err: err}
}

// errorTextEnds is how much of a logged error's text is kept at each end.
// Go's transport quotes what the shop sent: a status line that does not
// parse, up to the 64 KiB of headers allowed (a byte that is not text
// written \xff, four times its size), or a GOAWAY's debug data; one answer
// made a "shop call failed" line of 300 KB. The start holds the URL asked,
// the end what failed.
const errorTextEnds = 1024

// bounded returns s, or its first and last errorTextEnds bytes (cut at
// a character's start) with what lies between them left out. It is applied
// once the key is out of s: a key that spanned the cut is out of it too.
func bounded(s string) string {
	if len(s) <= 2*errorTextEnds+64 {
		return s
	}
	head, tail := errorTextEnds, len(s)-errorTextEnds
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return s[:head] + fmt.Sprintf(" ... (%d bytes left out) ... ", tail-head) + s[tail:]
}

// keyFreeError is an error whose text was freed of the key (keyFree).
type keyFreeError struct {
	text string
	err  error
}

func (e *keyFreeError) Error() string { return e.text }
func (e *keyFreeError) Unwrap() error { return e.err }

// redactText replaces the key in free text, in any letter case, and its
// Basic credential, with REDACTED; if the text still holds the key once
// %-decoded, none of it is kept.
func redactText(s, key string) string {
	if key == "" {
		return s
	}
	s = replaceKey(s, key)
	// A text that cannot be %-decoded (a '%' without two hex digits after
	// it) might hide the key behind that '%': withheld too.
	if decoded, err := url.PathUnescape(s); err != nil || HoldsKey(decoded, key) {
		return "the error's text is withheld: it may hold the shop key"
	}
	return s
}

// replaceKey replaces the key, in any letter case, and its Basic
// credential, with REDACTED.
func replaceKey(s, key string) string {
	if key == "" {
		return s
	}
	// The longest first: a key quoted twice holds it quoted once.
	forms := secretForms(key)
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	for _, secret := range forms {
		// A regular expression only where the secret is: every URL a
		// span records comes through here, and almost none holds it.
		if strings.Contains(strings.ToLower(s), strings.ToLower(secret)) {
			s = regexp.MustCompile("(?i)"+regexp.QuoteMeta(secret)).ReplaceAllLiteralString(s, redacted)
		}
	}
	return s
}

type keyInContext struct{}

// withKey lets tracingTransport know the call's key on every hop, also
// after a redirect to another host, which drops the Authorization header.
func withKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyInContext{}, key)
}

// keyPartRun is the shortest run of a key's characters that holdsPartOfKey
// finds: longer than any letters a real version's suffix runs to ("beta",
// "build"), short enough that a version keeps no useful part of a key.
const keyPartRun = 6

// holdsPartOfKey reports whether v holds keyPartRun characters in a row of
// key, in any case. HoldsKey finds the whole key; a version header of 31
// characters could carry 29 of a key's 32 ("8." and the rest), which the
// answer and the log line would keep.
func holdsPartOfKey(v, key string) bool {
	lower := strings.ToLower(v)
	key = strings.ToLower(key)
	for i := 0; i+keyPartRun <= len(key); i++ {
		if strings.Contains(lower, key[i:i+keyPartRun]) {
			return true
		}
	}
	return false
}
