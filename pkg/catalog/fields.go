package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Field limits. Every id (item, coin, image) has MaxItemIDLen, the database
// check on item ids; the text limits keep one rendered item well under a
// page's worth of bytes.
const (
	maxTitleLen       = 500
	maxDescriptionLen = 20000
	maxURLLen         = 2048
	maxImages         = 100
	maxPosition       = 1_000_000
)

// maxPrice is the first value numeric(18,4) cannot hold.
var maxPrice = new(big.Rat).SetInt64(100_000_000_000_000)

func isNull(raw json.RawMessage) bool { return raw == nil || string(raw) == "null" }

// jsonString decodes a JSON string; ok is false for any other JSON type.
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// checkText rejects what PostgreSQL or a consumer cannot take: NUL and other
// control characters (newline and tab allowed when multiline).
func checkText(s string, maxLen int, multiline bool) string {
	if n := utf8.RuneCountInString(s); n > maxLen {
		return fmt.Sprintf("must be at most %d characters, got %d", maxLen, n)
	}
	for _, r := range s {
		if unicode.IsControl(r) && !(multiline && (r == '\n' || r == '\t' || r == '\r')) {
			return "must not contain control characters"
		}
	}
	return ""
}

// checkID returns why s cannot be an id (an item's, a coin's or an
// image's), or "": the one rule every id follows, so the import and
// ValidItemID cannot drift apart. The reasons are meant to follow the
// field's name.
func checkID(s string) string {
	switch {
	case strings.TrimSpace(s) == "":
		return "must not be empty"
	case !utf8.ValidString(s):
		// Only ValidItemID meets this: JSON decoding has replaced bad bytes.
		return "must be valid UTF-8"
	}
	if reason := checkText(s, MaxItemIDLen, false); reason != "" {
		return reason
	}
	if s != strings.TrimSpace(s) {
		return "must not start or end with white space"
	}
	return ""
}

func parseID(raw json.RawMessage, required bool) (string, string) {
	if isNull(raw) {
		if required {
			return "", "required"
		}
		return "", ""
	}
	s, ok := jsonString(raw)
	if !ok {
		return "", "must be a string"
	}
	return s, checkID(s)
}

// parseItemID reads the item id, the one id that travels in URLs: an id,
// and one ValidItemID accepts.
func parseItemID(raw json.RawMessage) (string, string) {
	s, reason := parseID(raw, true)
	if reason != "" {
		return "", reason
	}
	if err := ValidItemID(s); err != nil {
		return "", err.Error()
	}
	return s, ""
}

func parseCoinID(raw json.RawMessage) (*string, string) {
	if isNull(raw) {
		return nil, ""
	}
	s, reason := parseID(raw, true)
	if reason != "" {
		return nil, reason
	}
	return &s, ""
}

func parseStatus(raw json.RawMessage) (string, string) {
	if isNull(raw) {
		return "", "required"
	}
	s, ok := jsonString(raw)
	if !ok || (s != StatusActive && s != StatusInactive) {
		return "", "must be active or inactive"
	}
	return s, ""
}

// checkStock accepts stock_quantity only as a consistent echo of status:
// stock is derived (1 when active, 0 otherwise), never imported.
func checkStock(status string, raw json.RawMessage) string {
	if raw == nil {
		return ""
	}
	want := "0"
	if status == StatusActive {
		want = "1"
	}
	if string(raw) != want {
		return fmt.Sprintf("must be %s when status is %s, or left out (stock is derived from status)", want, status)
	}
	return ""
}

func parsePrice(raw json.RawMessage) (*json.Number, string) {
	const reason = "must be a non-negative number with at most 4 decimal places and below 10^14, or null"
	if isNull(raw) {
		return nil, ""
	}
	if raw[0] == '"' || raw[0] == '{' || raw[0] == '[' || raw[0] == 't' || raw[0] == 'f' {
		return nil, "must be a non-negative number"
	}
	r, ok := new(big.Rat).SetString(string(raw))
	if ok && r.Sign() < 0 {
		// -0 (Python writes -0.0 for a zero price negated) is 0.
		return nil, "must be a non-negative number"
	}
	if !ok || r.Cmp(maxPrice) >= 0 {
		return nil, reason
	}
	scaled := new(big.Rat).Mul(r, big.NewRat(10_000, 1))
	if !scaled.IsInt() {
		return nil, reason
	}
	n := json.Number(canonicalDecimal(r))
	if significantDigits(string(n)) > maxPriceDigits {
		return nil, fmt.Sprintf("must have at most %d significant digits, so that a client reading JSON numbers as doubles (JavaScript, most JSON libraries) gets the same price back", maxPriceDigits)
	}
	return &n, ""
}

// maxPriceDigits is how many significant decimal digits every float64
// holds exactly: any decimal of 15 digits or fewer survives the round trip
// through a double, one of 16 may not (1234567890123.4567 comes back as
// 1234567890123.4568). numeric(18,4) would store up to 18.
const maxPriceDigits = 15

// significantDigits counts the digits of a canonical decimal from its
// first non-zero one ("0.0012" has 2, "1200" has 4).
func significantDigits(decimal string) int {
	digits := strings.TrimLeft(strings.Replace(decimal, ".", "", 1), "0")
	return len(digits)
}

// canonicalDecimal writes r with at most 4 fractional digits and no trailing
// zeros, the way PostgreSQL's numeric keeps the value.
func canonicalDecimal(r *big.Rat) string {
	s := r.FloatString(4)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

func parseCurrency(raw json.RawMessage) (string, string) {
	if isNull(raw) {
		return "", "required"
	}
	s, ok := jsonString(raw)
	if !ok || !isCurrency(s) {
		return "", "must be an ISO 4217 currency code such as EUR or UAH"
	}
	return s, ""
}

func parseCategory(raw json.RawMessage) (json.RawMessage, string) {
	if isNull(raw) {
		return nil, ""
	}
	if raw[0] != '{' {
		return nil, "must be an object or null"
	}
	return canonicalObject(raw)
}

func parseCharacteristics(raw json.RawMessage) (json.RawMessage, string) {
	if raw == nil {
		return json.RawMessage("{}"), ""
	}
	if raw[0] != '{' {
		return nil, "must be an object"
	}
	return canonicalObject(raw)
}

// canonicalObject re-encodes a JSON object compactly with sorted keys, so the
// same content always renders to the same bytes (and re-imports of it are
// "unchanged").
func canonicalObject(raw json.RawMessage) (json.RawMessage, string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, "must be valid JSON"
	}
	if hasNUL(v) {
		return nil, "must not contain the NUL character"
	}
	if hasHugeNumber(v) {
		return nil, "must not hold a number beyond a double's range (±1.8e308): clients that read JSON numbers as doubles get Infinity, and Go's encoding/json refuses the whole page"
	}
	if hasUnstorableNumber(v) {
		return nil, fmt.Sprintf("must not hold a number with more than %d digits after the decimal point (as 1e-%d or 0e-20000), or an exponent past ±%d (as 0e%d): PostgreSQL's numeric, which stores it, cannot", maxNumericScale, maxNumericScale+1, maxNumericExponent, maxNumericExponent+1)
	}
	if depth := nesting(v); depth > maxNesting {
		return nil, fmt.Sprintf("must not nest objects and arrays more than %d levels deep, got %d: a list page puts it 3 levels deeper, and clients' parsers refuse the whole page past their limit (Ruby's JSON at 100 levels, PHP's json_decode at 512, Python's json near 1000)", maxNesting, depth)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, "must be valid JSON"
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), ""
}

// hasHugeNumber reports a number that no float64 holds (1e400): exported as
// written, it is Infinity to JavaScript and an error to encoding/json, whose
// Unmarshal of the page then fails as a whole.
func hasHugeNumber(v any) bool {
	return hasNumber(v, func(n json.Number) bool {
		_, err := strconv.ParseFloat(string(n), 64)
		return err != nil
	})
}

// hasNumber reports whether v (decoded with UseNumber) holds a number, at
// any depth, for which bad is true.
func hasNumber(v any, bad func(json.Number) bool) bool {
	switch v := v.(type) {
	case json.Number:
		return bad(v)
	case []any:
		return slices.ContainsFunc(v, func(e any) bool { return hasNumber(e, bad) })
	case map[string]any:
		for _, e := range v {
			if hasNumber(e, bad) {
				return true
			}
		}
	}
	return false
}

// maxNumericScale is the most digits after the decimal point that
// PostgreSQL's numeric holds (NUMERIC_DSCALE_MAX), and maxNumericExponent
// the largest exponent, either way, that its input reads (below INT_MAX/2),
// whatever the digits before it: a jsonb number is a numeric, and a number
// past either (1e-16384, 0e-20000, "1." and 16384 zeros, 0e1073741823)
// fails the whole import's COPY with "value overflows numeric format",
// naming no line. (A zero is the one number such an exponent leaves within
// a double's range.)
const (
	maxNumericScale    = 16383
	maxNumericExponent = math.MaxInt32/2 - 1
)

// hasUnstorableNumber reports a number PostgreSQL's numeric cannot hold.
func hasUnstorableNumber(v any) bool {
	return hasNumber(v, func(n json.Number) bool { return !numericHolds(string(n)) })
}

// numericHolds reports whether PostgreSQL's numeric holds the JSON number
// n: its exponent within maxNumericExponent, and its digits after the
// decimal point, once the exponent is applied, at most maxNumericScale
// (trailing zeros count: PostgreSQL keeps them).
func numericHolds(n string) bool {
	mantissa, exponent, _ := strings.Cut(strings.ToLower(n), "e")
	e := 0
	if exponent != "" {
		var err error
		if e, err = strconv.Atoi(exponent); err != nil || e > maxNumericExponent || e < -maxNumericExponent {
			return false // err: beyond an int, so beyond the bound too
		}
	}
	_, fraction, _ := strings.Cut(mantissa, ".")
	return len(fraction)-e <= maxNumericScale
}

// maxNesting bounds the levels of objects and arrays in a category or the
// characteristics (the object itself is the first): an item exported with
// more makes its whole list page unreadable to clients whose JSON parsers
// stop at a depth (a page adds 3 levels above it).
const maxNesting = 64

// nesting is how many levels of objects and arrays v has (0 for a scalar).
func nesting(v any) int {
	deepest := 0
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			deepest = max(deepest, nesting(e))
		}
	case map[string]any:
		for _, e := range v {
			deepest = max(deepest, nesting(e))
		}
	default:
		return 0
	}
	return deepest + 1
}

// hasNUL reports a NUL in any key or string: jsonb cannot store it.
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, 0)
	case []any:
		return slices.ContainsFunc(v, hasNUL)
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

func parseImages(raw json.RawMessage) ([]Image, string) {
	if raw == nil {
		return []Image{}, ""
	}
	var elems []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &elems) != nil {
		return nil, "must be an array"
	}
	if len(elems) > maxImages {
		return nil, fmt.Sprintf("must hold at most %d images", maxImages)
	}
	images := make([]Image, 0, len(elems))
	ids, positions := map[string]bool{}, map[int]bool{}
	for i, e := range elems {
		img, reason := parseImage(e)
		switch {
		case reason != "":
		case ids[img.ID]:
			reason = fmt.Sprintf("id: %q repeats an earlier image", img.ID)
		case positions[img.Position]:
			reason = fmt.Sprintf("position: %d repeats an earlier image", img.Position)
		}
		if reason != "" {
			return nil, fmt.Sprintf("[%d].%s", i, reason)
		}
		ids[img.ID], positions[img.Position] = true, true
		images = append(images, img)
	}
	slices.SortFunc(images, func(a, b Image) int { return a.Position - b.Position })
	return images, ""
}

func parseImage(raw json.RawMessage) (Image, string) {
	var f map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &f) != nil {
		return Image{}, "must be an object"
	}
	for name := range f {
		if name != "id" && name != "url" && name != "position" && name != "type" {
			return Image{}, name + ": unknown field"
		}
	}
	var img Image
	var reason string
	if img.ID, reason = parseID(f["id"], true); reason != "" {
		return Image{}, "id: " + reason
	}
	if img.URL, reason = parseURL(f["url"]); reason != "" {
		return Image{}, "url: " + reason
	}
	if img.Position, reason = parsePosition(f["position"]); reason != "" {
		return Image{}, "position: " + reason
	}
	if img.Type, reason = parseImageType(f["type"]); reason != "" {
		return Image{}, "type: " + reason
	}
	return img, ""
}

func parseURL(raw json.RawMessage) (string, string) {
	if isNull(raw) {
		return "", "required"
	}
	s, ok := jsonString(raw)
	if !ok {
		return "", "must be a string"
	}
	if len(s) > maxURLLen {
		return "", fmt.Sprintf("must be at most %d bytes", maxURLLen)
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Hostname() == "" || u.User != nil ||
		strings.ContainsAny(s, " \t\r\n\\") || checkText(s, maxURLLen, false) != "" {
		return "", "must be an absolute https URL with a host and no user info"
	}
	if i := strings.IndexFunc(s, notURIChar); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return "", fmt.Sprintf("must be a URI (spec 2.3): %q is not allowed in one; percent-encode it (UTF-8 bytes, as %%C3%%A9 for é), and write a non-ASCII host in its xn-- form", r)
	}
	if reason := uriPlacement(s); reason != "" {
		return "", "must be a URI (spec 2.3): " + reason
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", "must be a URI with a port from 1 to 65535"
		}
	}
	// The scheme in its canonical lower case (RFC 3986 3.1), which url.Parse
	// read case-insensitively: HTTPS://… exported as sent failed the
	// ^https:// a consumer checks (gateway/openapi.yaml's Image.url).
	return "https" + s[len("https"):], ""
}

// notURIChar reports a character that RFC 3986 allows nowhere in a URI:
// anything outside its unreserved and reserved characters and '%' (Go's
// url.Parse takes '"', '<', '{', a space's neighbours and every non-ASCII
// letter as they are; uriPlacement checks where '%', '#', '[' and ']'
// stand). A consumer that
// validates the URI format, or pastes the URL into HTML or a feed, would
// otherwise get one that breaks there.
func notURIChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return false
	case strings.ContainsRune("-._~:/?#[]@!$&'()*+,;=%", r):
		return false
	}
	return true
}

// uriPlacement says what in s (made of URI characters only, notURIChar,
// and passed by url.Parse with a host) stands where RFC 3986 allows it
// nowhere, or "". url.Parse takes each of these: it checks the escapes of
// the host, path and fragment but not the query's, takes a second '#' into
// the fragment, and '[' or ']' outside the host.
func uriPlacement(s string) string {
	if strings.Count(s, "#") > 1 {
		return "'#' is allowed once (percent-encode another as %23)"
	}
	// After "scheme://", the authority runs to the first '/', '?' or '#';
	// an IPv6 host's brackets are in it, and nowhere else may be one.
	_, rest, _ := strings.Cut(s, "://")
	if end := strings.IndexAny(rest, "/?#"); end >= 0 && strings.ContainsAny(rest[end:], "[]") {
		return "'[' and ']' are allowed only around an IPv6 host (percent-encode them as %5B and %5D)"
	}
	for i := strings.IndexByte(s, '%'); i >= 0; i = strings.IndexByte(s, '%') {
		if len(s) < i+3 || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return "'%' must start an escape of two hex digits (write '%' itself as %25)"
		}
		s = s[i+3:]
	}
	return ""
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func parsePosition(raw json.RawMessage) (int, string) {
	const reason = "must be an integer from 0 to 1000000"
	if isNull(raw) {
		return 0, "required"
	}
	var n json.Number
	if raw[0] == '"' || json.Unmarshal(raw, &n) != nil {
		return 0, reason
	}
	v, err := n.Int64()
	if err != nil || v < 0 || v > maxPosition {
		return 0, reason
	}
	return int(v), ""
}

func parseImageType(raw json.RawMessage) (string, string) {
	if isNull(raw) {
		return "", "required"
	}
	s, ok := jsonString(raw)
	if !ok || !slices.Contains(ImageTypes, s) {
		return "", "must be one of obverse, reverse, edge, gallery"
	}
	return s, ""
}

func parseTexts(raw json.RawMessage) (map[string]Text, string) {
	if isNull(raw) {
		return nil, "required, with at least ENG"
	}
	var f map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &f) != nil {
		return nil, "must be an object keyed by language"
	}
	texts := make(map[string]Text, len(f))
	for _, lang := range Languages {
		// A null translation is an absent one, as null is for every other
		// optional field (a serializer writes a missing RUS as null).
		if isNull(f[lang]) {
			continue
		}
		if f[lang][0] != '{' {
			return nil, lang + ": must be an object with title and description"
		}
		t, reason := parseText(f[lang])
		if reason != "" {
			return nil, lang + "." + reason
		}
		texts[lang] = t
	}
	for lang := range f {
		if !slices.Contains(Languages, lang) {
			return nil, lang + ": unknown language (allowed: ENG, RUS, UKR)"
		}
	}
	if _, ok := texts[Lang]; !ok {
		return nil, "ENG: required"
	}
	return texts, ""
}

// parseText reads one translation, a JSON object (parseTexts checks that);
// its reasons start with the member's name.
func parseText(raw json.RawMessage) (Text, string) {
	var f map[string]json.RawMessage
	if json.Unmarshal(raw, &f) != nil {
		return Text{}, "title: required"
	}
	for name := range f {
		if name != "title" && name != "description" {
			return Text{}, name + ": unknown field"
		}
	}
	title, ok := jsonString(f["title"])
	switch {
	case f["title"] == nil:
		return Text{}, "title: required"
	case !ok:
		return Text{}, "title: must be a string"
	case strings.TrimSpace(title) == "":
		return Text{}, "title: must not be empty"
	}
	if reason := checkText(title, maxTitleLen, false); reason != "" {
		return Text{}, "title: " + reason
	}
	t := Text{Title: title}
	if !isNull(f["description"]) {
		d, ok := jsonString(f["description"])
		if !ok {
			return Text{}, "description: must be a string"
		}
		if reason := checkText(d, maxDescriptionLen, true); reason != "" {
			return Text{}, "description: " + reason
		}
		t.Description = d
	}
	return t, ""
}
