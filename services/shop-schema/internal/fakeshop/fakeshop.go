// Package fakeshop is a PrestaShop webservice for tests: HTTPS on 127.0.0.1
// with its own certificate, answering /api/... and
// webservice/dispatcher.php?url=... the way PrestaShop 1.7, 8 and 9 do,
// quirks included (bare [] for an empty list, strings or native ints,
// multilingual arrays or plain strings, plain-text 401 without a key, the
// JSON error bodies of reference/prestashop-webservice.md §1.2).
package fakeshop

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Key is the webservice key the fake shop accepts.
const Key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"

// Lang is an installed language.
type Lang struct {
	ID     int
	ISO    string
	Locale string
	Name   string
	Active bool
}

// Category is a category; Names is keyed by language id.
type Category struct {
	ID, ParentID, Depth, Position int
	Active, Root                  bool
	Names                         map[int]string
}

// Feature is a product feature.
type Feature struct {
	ID, Position int
	Names        map[int]string
}

// Value is a feature value; Custom marks a per-product value.
type Value struct {
	ID, FeatureID int
	Custom        bool
	Names         map[int]string
}

// Shop is the fake shop's data and behaviour. Set fields before Start.
type Shop struct {
	Version    string // "1.7", "8" or "9": field sets and types
	NativeInts bool   // PHP 8.1 pdo_mysql: integers as JSON numbers
	Prefix     string // subfolder the shop is installed in, e.g. "/shop"
	NoRewrite  bool   // /api/ is not rewritten: only dispatcher.php works
	Languages  []Lang
	Categories []Category
	Features   []Feature
	Values     []Value

	// Behaviour switches.
	Disabled         bool            // 503 code 22
	WrongShop        bool            // 403 code 132
	DeniedResources  map[string]bool // 401 code 26 for these resources
	GetDenied        map[string]bool // 405 code 25: other permissions on these resources, not GET
	RejectFieldLists bool            // 400 code 35 for display=[...]
	IgnoreLimit      bool            // answers every row whatever limit= says
	Delay            time.Duration   // before every answer
	Oversize         int             // pad every list answer to at least this many bytes
	ServerError      bool            // 500 with a PHP warning error body
	HTML             bool            // answers an HTML page with 200
	// FrontOfficeStatus is the status of the front office's HTML pages,
	// which answer a path that is not the webservice (/api/ without
	// NoRewrite's rewrite rule): 404 when 0; 503 when the shop is in
	// maintenance mode, 403 when it restricts the caller's country. Only
	// the front office does so: the webservice answers as ever.
	FrontOfficeStatus int
	// ErrorPage, when set, is the status of an HTML page that the server
	// answers every request with before PHP sees it: 503 while PHP is
	// down, 403 from a firewall.
	ErrorPage int
	// DispatcherBlocked: a server rule answers a request for
	// webservice/dispatcher.php itself with a 404 page, as some hosts
	// harden PHP; /api's rewrite still reaches it.
	DispatcherBlocked bool
	DropAuth          bool                         // CGI without forwarding: PHP never sees Authorization
	Redirect          func(r *http.Request) string // a redirect target, or ""
	HeaderPadding     int                          // an answer header of this many bytes
	HeaderLines       int                          // this many answer headers of 1 KiB each
	CutShort          bool                         // a list answer's body ends before its Content-Length, the connection closed
	// StatusLine, when set, is written as the whole answer, the status
	// line of a broken shop, made from the key received (the connection is
	// then closed): a shop may answer garbage, even the key sent back.
	StatusLine func(key string) string

	// Certificate, when set, is the shop's TLS certificate instead of
	// httptest's (which names example.com and 127.0.0.1); CAPEM is then
	// its own.
	Certificate *tls.Certificate
	// MaxTLS, when set, is the newest TLS version the shop's server
	// speaks (tls.VersionTLS11: a host not updated for years).
	MaxTLS uint16
	// LegacyCiphers: the server offers only RSA key exchange, which
	// clients no longer accept.
	LegacyCiphers bool
	// ClientCertificate: the server asks every client for a certificate
	// (mutual TLS), as a host that guards its back office so does.
	ClientCertificate bool
	// HTTP2: the shop's server speaks HTTP/2 (ALPN h2), as most hosts'
	// nginx or CDN in front of PHP do.
	HTTP2 bool

	// Hold, when set, makes every answer wait until it is closed.
	Hold chan struct{}
	// HoldUntil, when above 0, makes the answers wait until that many
	// requests have arrived, so that fetches sent at once each meet the
	// shop as it is before any of them is answered.
	HoldUntil int
	// Unencodable lists resources holding a text that is not valid UTF-8:
	// PHP's json_encode fails on their lists, and PrestaShop answers 200
	// with an empty body.
	Unencodable map[string]bool
	// Stall lists resources whose requests get no answer until the client
	// gives up on them.
	Stall map[string]bool

	// What a host's server, or PHP itself, does to the webservice's
	// answers (reference §4, §5; README, "PrestaShop client").
	Gzip    bool // the server compresses every answer (Content-Encoding: gzip)
	BadGzip bool // answers are labelled Content-Encoding: gzip, and are not
	// Endless: a list answer whose rows never end, streamed until the
	// client leaves.
	Endless bool
	// Drip writes a list answer a byte at a time, this long apart.
	Drip time.Duration
	// PHPNotice: display_errors is on, and PHP prints a notice, as HTML,
	// before the JSON.
	PHPNotice bool
	// Charset is declared in the JSON answers' Content-Type;
	// "windows-1251" also re-encodes their bodies so, as a server that
	// transcodes does (PrestaShop writes UTF-8 only).
	Charset string
	// RewriteDropsQuery: the /api rewrite rule lacks [QSA], so the
	// webservice reads none of the query, output_format included, and
	// answers XML; dispatcher.php, asked directly, reads it.
	RewriteDropsQuery bool
	// XMLOnly: a webservice that answers XML whatever output_format says,
	// as PrestaShop did before 1.6.0.9.
	XMLOnly bool

	released chan struct{} // closed once HoldUntil requests have arrived
	srv      *httptest.Server
	conns    atomic.Int64
	mu       sync.Mutex
	reqLog   []string
	authLog  []string
	traces   []string
	agents   []string
}

// Start serves the shop over HTTPS on 127.0.0.1 and stops it at cleanup.
func (s *Shop) Start(cleanup func(func())) {
	s.StartOn("127.0.0.1:0", cleanup)
}

// StartOn serves the shop on addr.
func (s *Shop) StartOn(addr string, cleanup func(func())) {
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic(fmt.Sprintf("fakeshop: listen %s: %v", addr, err))
	}
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut short by tests are expected
	s.srv.EnableHTTP2 = s.HTTP2
	s.srv.TLS = &tls.Config{MaxVersion: s.MaxTLS}
	if s.MaxTLS != 0 {
		s.srv.TLS.MinVersion = tls.VersionTLS10
	}
	if s.LegacyCiphers {
		s.srv.TLS.MaxVersion, s.srv.TLS.CipherSuites = tls.VersionTLS12, []uint16{tls.TLS_RSA_WITH_AES_128_CBC_SHA}
	}
	if s.ClientCertificate {
		s.srv.TLS.ClientAuth = tls.RequireAnyClientCert
	}
	if s.Certificate != nil {
		s.srv.TLS.Certificates = []tls.Certificate{*s.Certificate}
	}
	s.srv.StartTLS()
	cleanup(s.srv.Close)
}

// URL is the shop's base_url (with the prefix).
func (s *Shop) URL() string { return s.srv.URL + s.Prefix }

// Addr is host:port of the listener.
func (s *Shop) Addr() string { return s.srv.Listener.Addr().String() }

// CAPEM is the PEM of the certificate that signs the shop's TLS certificate.
func (s *Shop) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

// Connections counts the TCP connections the shop accepted.
func (s *Shop) Connections() int64 { return s.conns.Load() }

// Keys lists the Basic user names received.
func (s *Shop) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.authLog)
}

// Traceparents lists the traceparent header of every request received
// ("" for none).
func (s *Shop) Traceparents() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.traces)
}

// UserAgents lists the User-Agent header of every request received.
func (s *Shop) UserAgents() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.agents)
}

// Requests lists "path?query" of every request received.
func (s *Shop) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqLog)
}

func (s *Shop) serve(w http.ResponseWriter, r *http.Request) {
	if s.Gzip {
		gz := gzip.NewWriter(w)
		defer gz.Close()
		w.Header().Set("Content-Encoding", "gzip")
		w = gzipWriter{ResponseWriter: w, gz: gz}
	}
	if s.BadGzip {
		w.Header().Set("Content-Encoding", "gzip")
	}
	if !s.recordAndWait(r) {
		return
	}
	s.padHeaders(w)
	if s.Redirect != nil {
		if target := s.Redirect(r); target != "" {
			http.Redirect(w, r, target, http.StatusFound)
			return
		}
	}
	if s.StatusLine != nil {
		s.writeRaw(w, r)
		return
	}
	if s.DispatcherBlocked && r.URL.Path == s.Prefix+"/webservice/dispatcher.php" {
		writePage(w, http.StatusNotFound)
		return
	}
	if s.ErrorPage != 0 {
		writePage(w, s.ErrorPage)
		return
	}
	resource, ok := s.route(r)
	if ok && s.Stall[resource] {
		<-r.Context().Done()
		return
	}
	if s.HTML {
		writePage(w, http.StatusOK)
		return
	}
	if !ok {
		writePage(w, cmp.Or(s.FrontOfficeStatus, http.StatusNotFound))
		return
	}
	w.Header().Set("X-Powered-By", "PrestaShop Webservice")
	w.Header().Set("Access-Time", strconv.FormatInt(time.Now().Unix(), 10))
	w.Header().Set("Execution-Time", "0.012")
	s.answer(w, r, resource)
}

// recordAndWait records r, then makes each wait the shop is set to
// (HoldUntil, Hold, Delay); false if the caller went first, and the answer
// is then left unwritten.
func (s *Shop) recordAndWait(r *http.Request) bool {
	if released := s.record(r); released != nil && !waited(r, released) {
		return false
	}
	if s.Hold != nil && !waited(r, s.Hold) {
		return false
	}
	return s.Delay <= 0 || waited(r, time.After(s.Delay))
}

// padHeaders adds the header bytes and lines the shop is set to send
// (HeaderPadding, HeaderLines).
func (s *Shop) padHeaders(w http.ResponseWriter) {
	if s.HeaderPadding > 0 {
		w.Header().Set("X-Padding", strings.Repeat("p", s.HeaderPadding))
	}
	for i := range s.HeaderLines {
		w.Header().Set(fmt.Sprint("X-Padding-", i), strings.Repeat("p", 1<<10))
	}
}

// writePage answers an HTML page, not the webservice's.
func writePage(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprint(w, "<!doctype html><html><body><h1>Page not found</h1></body></html>")
}

// record logs r, and returns the channel closed once HoldUntil requests
// have arrived (nil without HoldUntil).
func (s *Shop) record(r *http.Request) (released <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqLog = append(s.reqLog, r.URL.RequestURI())
	s.traces = append(s.traces, r.Header.Get("traceparent"))
	s.agents = append(s.agents, r.Header.Get("User-Agent"))
	if s.HoldUntil > 0 && s.released == nil {
		s.released = make(chan struct{})
	}
	if s.HoldUntil > 0 && len(s.reqLog) == s.HoldUntil {
		close(s.released)
	}
	return s.released
}

// waited waits for ready and reports whether it came before r ended (its
// caller gone), when the shop answers nothing.
func waited[T any](r *http.Request, ready <-chan T) bool {
	select {
	case <-ready:
		return true
	case <-r.Context().Done():
		return false
	}
}

// writeRaw writes StatusLine's line as the answer and closes the
// connection.
func (s *Shop) writeRaw(w http.ResponseWriter, r *http.Request) {
	key, _ := s.key(r)
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(fmt.Sprintf("fakeshop: hijack: %v", err))
	}
	defer conn.Close()
	buf.WriteString(s.StatusLine(key) + "\r\n\r\n")
	buf.Flush()
}

// route finds the resource of an /api/<res> or dispatcher.php?url=<res>
// request under the prefix.
func (s *Shop) route(r *http.Request) (string, bool) {
	path, ok := strings.CutPrefix(r.URL.Path, s.Prefix)
	if !ok {
		return "", false
	}
	switch {
	case path == "/webservice/dispatcher.php":
		return r.URL.Query().Get("url"), true
	case strings.HasPrefix(path, "/api/") && !s.NoRewrite:
		if s.RewriteDropsQuery {
			r.URL.RawQuery = ""
		}
		return strings.TrimPrefix(path, "/api/"), true
	}
	return "", false
}

// answer runs PrestaShop's checks in its order (WebserviceRequest::fetch).
func (s *Shop) answer(w http.ResponseWriter, r *http.Request, resource string) {
	key, hasKey := s.key(r)
	if !hasKey {
		w.Header().Set("WWW-Authenticate", `Basic realm="Welcome to PrestaShop Webservice, please enter the authentication key as the login. No password required."`)
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, "401 Unauthorized")
		return
	}
	w.Header().Set("PSWS-Version", "0")
	realm := `Basic realm="Welcome to PrestaShop Webservice, please enter the authentication key as the login. No password required."`
	switch {
	case s.Disabled:
		writeErrors(w, 503, 22, "The PrestaShop webservice is disabled. Please activate it in the PrestaShop Back Office")
	case key == "":
		w.Header().Set("WWW-Authenticate", realm)
		writeErrors(w, 401, 17, "Authentication key is empty")
	case len(key) != 32:
		w.Header().Set("WWW-Authenticate", realm)
		writeErrors(w, 401, 18, "Invalid authentication key format")
	case key != Key:
		w.Header().Set("WWW-Authenticate", realm)
		writeErrors(w, 401, 20, "Authentification key is not active", 21, "No permission for this authentication key")
	case s.WrongShop:
		writeErrors(w, 403, 132, "No permission for this key on this shop")
	case s.DeniedResources[resource]:
		writeErrors(w, 401, 26, fmt.Sprintf("Resource of type \"%s\" is not allowed with this authentication key", resource))
	case s.GetDenied[resource]:
		writeErrors(w, 405, 25, fmt.Sprintf("Method GET is not allowed for the resource %s with this authentication key", resource))
	case s.ServerError:
		writeErrors(w, 500, 2, "[PHP Warning #2] Undefined array key 1 (/var/www/classes/Thing.php, line 12)")
	case s.CutShort:
		w.Header().Set("Content-Length", "100000")
		fmt.Fprint(w, `{"`+resource+`":[{"id":`)
	default:
		w.Header().Set("PSWS-Version", s.psVersion())
		s.list(w, r, resource)
	}
}

// key reads the key the way dispatcher.php does: Basic user name (password
// ignored), else the ws_key query parameter.
func (s *Shop) key(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); !s.DropAuth && strings.HasPrefix(strings.ToLower(h), "basic ") {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(h[6:]))
		if err == nil {
			user, _, _ := strings.Cut(string(raw), ":")
			s.mu.Lock()
			s.authLog = append(s.authLog, user)
			s.mu.Unlock()
			return strings.TrimSpace(user), true
		}
	}
	if r.URL.Query().Has("ws_key") {
		return strings.TrimSpace(r.URL.Query().Get("ws_key")), true
	}
	return "", false
}

func (s *Shop) psVersion() string {
	switch s.Version {
	case "1.7":
		return "1.7.8.10"
	case "9":
		return "9.0.3"
	}
	return "8.2.1"
}

func writeErrors(w http.ResponseWriter, status int, pairs ...any) {
	var errs []map[string]any
	for i := 0; i+1 < len(pairs); i += 2 {
		errs = append(errs, map[string]any{"code": pairs[i], "message": pairs[i+1]})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(phpJSON(map[string]any{"errors": errs}))
}

// list renders a list answer with PrestaShop's display, sort, limit and
// filter[custom] handling.
func (s *Shop) list(w http.ResponseWriter, r *http.Request, resource string) {
	q := r.URL.Query()
	if s.XMLOnly || q.Get("output_format") != "JSON" && r.Header.Get("Output-Format") != "JSON" {
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<prestashop xmlns:xlink=\"http://www.w3.org/1999/xlink\">\n<%s>\n</%[1]s>\n</prestashop>\n", resource)
		return
	}
	display := q.Get("display")
	if s.RejectFieldLists && display != "full" && display != "" {
		writeErrors(w, 400, 35, "Unable to display this field. However, these are available: ...")
		return
	}
	rows, ok := s.rows(resource, q.Get("filter[custom]"))
	if !ok {
		writeErrors(w, 400, 27, fmt.Sprintf("Resource of type \"%s\" does not exists.", resource))
		return
	}
	if s.Unencodable[resource] {
		return // echo json_encode(...) printed false: nothing
	}
	if q.Get("sort") == "[id_ASC]" {
		sort.SliceStable(rows, func(i, j int) bool { return rows[i]["id"].(int) < rows[j]["id"].(int) })
	}
	if lim := q.Get("limit"); lim != "" && !s.IgnoreLimit {
		rows = applyLimit(rows, lim)
	}
	w.Header().Set("Content-Type", "application/json")
	if s.Charset != "" {
		w.Header().Set("Content-Type", "application/json; charset="+s.Charset)
	}
	if s.Endless {
		s.writeEndless(w, r, resource)
		return
	}
	if len(rows) == 0 {
		w.Write([]byte("[]")) // PrestaShop drops the wrapper of an empty list
		return
	}
	out := make([]orderedRow, 0, len(rows))
	for _, row := range rows {
		out = append(out, s.render(resource, row, display))
	}
	body := phpJSON(map[string]any{resource: out})
	if s.Oversize > len(body) {
		body = append(body[:len(body)-1], []byte(`,"padding":"`+strings.Repeat("x", s.Oversize)+`"}`)...)
	}
	if s.PHPNotice {
		body = append([]byte(phpNotice), body...)
	}
	if s.Charset == "windows-1251" {
		body = windows1251(body)
	}
	w.Header().Set("Content-Sha1", "da39a3ee5e6b4b0d3255bfef95601890afd80709")
	if s.Drip > 0 {
		drip(w, r, body, s.Drip)
		return
	}
	w.Write(body)
}

func applyLimit(rows []map[string]any, lim string) []map[string]any {
	offset, count := 0, 0
	if a, b, ok := strings.Cut(lim, ","); ok {
		offset, _ = strconv.Atoi(a)
		count, _ = strconv.Atoi(b)
	} else {
		count, _ = strconv.Atoi(lim)
	}
	if offset >= len(rows) {
		return nil
	}
	return rows[offset:min(len(rows), offset+count)]
}

// phpJSON encodes like json_encode(JSON_UNESCAPED_UNICODE): raw UTF-8, "/"
// escaped as "\/", "<>&" left alone.
func phpJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return bytes.ReplaceAll(bytes.TrimSpace(buf.Bytes()), []byte("/"), []byte(`\/`))
}

// Sample returns a shop with English, Russian and Ukrainian, a small
// category tree, two features, shared and custom values.
func Sample(version string, nativeInts bool) *Shop {
	n := func(en, ru, uk string) map[int]string { return map[int]string{1: en, 2: ru, 3: uk} }
	return &Shop{
		Version:    version,
		NativeInts: nativeInts,
		Languages: []Lang{
			{ID: 1, ISO: "en", Locale: "en-US", Name: "English (English)", Active: true},
			{ID: 2, ISO: "ru", Locale: "ru-RU", Name: "Русский (Russian)", Active: true},
			{ID: 3, ISO: "uk", Locale: "uk-UA", Name: "Українська (Ukrainian)", Active: true},
		},
		Categories: []Category{
			{ID: 1, ParentID: 0, Depth: 0, Active: true, Names: n("Root", "Корень", "Корінь")},
			{ID: 2, ParentID: 1, Depth: 1, Active: true, Root: true, Names: n("Home", "Главная", "Головна")},
			{ID: 9, ParentID: 2, Depth: 2, Position: 1, Active: false, Names: n("Coins/Medals", "Монеты", "Монети")},
			{ID: 3, ParentID: 2, Depth: 2, Position: 0, Active: true, Names: n("Banknotes", "Банкноты", "Банкноти")},
		},
		Features: []Feature{
			{ID: 1, Position: 0, Names: n("Metal", "Металл", "Метал")},
			{ID: 2, Position: 1, Names: n("Country", "Страна", "Країна")},
			{ID: 5, Position: 2, Names: n("Empty", "Пусто", "Порожньо")},
		},
		Values: []Value{
			{ID: 1, FeatureID: 1, Names: n("Silver", "Серебро", "Срібло")},
			{ID: 2, FeatureID: 1, Names: n("Gold", "Золото", "Золото")},
			{ID: 7, FeatureID: 2, Names: n("Ukraine", "Украина", "Україна")},
			{ID: 8, FeatureID: 2, Custom: true, Names: n("Made for one product", "x", "x")},
			{ID: 9, FeatureID: 99, Names: n("Orphan of a feature not in this shop", "x", "x")},
		},
	}
}
