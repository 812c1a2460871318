package api

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/strictjson"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/go-json-experiment/json/jsontext"
)

// Limits of spec 8 and of this service.
const (
	maxIdempotencyKey  = 128
	maxExternalOrderID = 128
	maxBodyBytes       = 16 << 10 // a valid body is well under 1 KiB
	maxNameInMessage   = 64
)

// holdsAPIKey ends the refusal of an Idempotency-Key or external_order_id
// holding an API key's secret (apikey.ContainsKeySecret: a client that
// pasted its key in the wrong place, also with its checksum cut off or
// mistyped). Both are stored as sent, for the retention and in the sale's
// row, where a key would sit in plain text beside the hashes kept of keys
// (spec 5: never in logs or the like). A value that merely starts like one
// (an order numbered "CXR-…", "cxw_ORDER…") is an order id like any
// other, masked in logs only.
// The message names the shape refused, since random text holds it on rare
// occasions (a base64url Idempotency-Key of 128 characters once in about
// 38,000): its client then knows what to change.
const holdsAPIKey = "holds an API key (cxr_, cxw_ or cxa_ and 43 letters or digits): send the key only as X-API-Key, " +
	"and revoke this one, as it may have been logged on its way here; a value that is no key must not have that shape"

// Error codes of a bad request.
const (
	codeInvalidBody        = "invalid_body"
	codeInvalidKey         = "invalid_idempotency_key"
	codeInvalidContentType = "invalid_content_type"
	codeInvalidParameter   = "invalid_parameter"
)

// decode validates everything about the call before any of it is written:
// the caller's identity, the query (none), the headers, the body, the item
// id.
func decode(w http.ResponseWriter, r *http.Request, op sales.Operation) (sales.Request, error) {
	id, err := caller(r)
	if err != nil {
		return sales.Request{}, err
	}
	// The key is read first, so that the call's line names it whatever is
	// refused next (a platform quoting its key finds even a query string's
	// 400); its own refusal still comes after those of the query and the
	// Content-Type, as before.
	key, keyErr := idempotencyKey(r.Header.Values("Idempotency-Key"))
	if key != "" {
		httpserver.AnnotateClientValue(w, r, "idempotency_key", key)
	}
	if r.URL.RawQuery != "" {
		// Read by no one, a parameter would be ignored: "?dry_run=1" would
		// sell the item for real.
		return sales.Request{}, badRequest(codeInvalidParameter,
			"the sale routes read no query parameters; the request is the JSON body")
	}
	if err := contentType(r.Header.Get("Content-Type")); err != nil {
		return sales.Request{}, err
	}
	if keyErr != nil {
		return sales.Request{}, keyErr
	}
	body, err := readBody(w, r)
	if err != nil {
		return sales.Request{}, err
	}
	orderID, quantity, err := parseBody(body)
	if err != nil {
		return sales.Request{}, err
	}
	itemID := r.PathValue("item_id")
	if !catalog.StorableItemID(itemID) {
		return sales.Request{}, sales.ErrNotFound
	}
	return sales.Request{
		Operation:       op,
		OwnerID:         id.OwnerID,
		PlatformID:      id.PlatformID,
		IdempotencyKey:  key,
		ItemID:          itemID,
		ExternalOrderID: orderID,
		Quantity:        quantity,
	}, nil
}

// The caller's key cannot make a sale (spec 5); writeError answers each
// 401 or 403 with its text.
var (
	errNoKey      = errors.New("this route needs an API key")
	errNoScope    = errors.New("the API key lacks scope sales:write")
	errNoPlatform = errors.New("the API key is not bound to a platform")
	errNoOwner    = errors.New("the API key is not bound to a valid owner")
)

// caller checks what the gateway checks too (spec 5): a key, scope
// sales:write and a platform bound to the key.
func caller(r *http.Request) (identity.Identity, error) {
	id, ok := identity.FromContext(r.Context())
	if !ok || id.Anonymous() {
		return id, errNoKey
	}
	if !id.HasScope(identity.ScopeSalesWrite) {
		return id, errNoScope
	}
	if id.PlatformID == "" {
		return id, errNoPlatform
	}
	if !isUUID(id.OwnerID) {
		return id, errNoOwner
	}
	return id, nil
}

func contentType(value string) error {
	mediaType, params, err := mime.ParseMediaType(value)
	if err != nil || mediaType != "application/json" {
		return badRequest(codeInvalidContentType, "Content-Type must be application/json"+whatWasSent(value, mediaType, err))
	}
	if cs, ok := params["charset"]; ok && !isUTF8Label(cs) {
		return badRequest(codeInvalidContentType, "the body must be UTF-8 JSON")
	}
	return nil
}

// whatWasSent ends the Content-Type refusal with the type the request had,
// because each HTTP library sends its own default for a body given as a
// string or a map (fetch text/plain, axios a form, PHP curl's array
// multipart/form-data, Python requests' data= none), and its users, who
// see the JSON they meant, recognise their library's choice at once. The
// type is a lower-case token pair (mime checks it), so it is short and
// printable; one holding something like an API key is not repeated, since
// an answer's message is logged and traced.
func whatWasSent(value, mediaType string, err error) string {
	switch {
	case strings.TrimSpace(value) == "":
		return "; the request has none"
	case err != nil:
		return "; the one sent cannot be read"
	case len(mediaType) > maxQuotedMediaType || apikey.ContainsKeyLike(mediaType):
		return ""
	}
	return ", not " + mediaType
}

// maxQuotedMediaType bounds the type whatWasSent repeats: registered ones
// are far shorter (application/x-www-form-urlencoded is 33 bytes).
const maxQuotedMediaType = 64

// utf8Labels are the names the WHATWG Encoding Standard gives UTF-8, which
// is how browsers and most HTTP libraries read a charset: "utf8" (PHP and
// MySQL's spelling, common in PrestaShop modules) names the same bytes as
// "utf-8", and refusing it told such a client that its UTF-8 body was not.
var utf8Labels = []string{"utf-8", "utf8", "unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "x-unicode20utf8"}

// isUTF8Label reports whether a Content-Type's charset names UTF-8 (labels
// are ASCII, matched without regard to case).
func isUTF8Label(charset string) bool {
	for _, label := range utf8Labels {
		if strings.EqualFold(charset, label) {
			return true
		}
	}
	return false
}

// idempotencyKey returns the single Idempotency-Key header: 1 to 128
// printable ASCII characters (spec 4.5, 8).
func idempotencyKey(values []string) (string, error) {
	switch {
	case len(values) == 0 || values[0] == "" && len(values) == 1:
		return "", badRequest(codeInvalidKey, "the Idempotency-Key header is required")
	case len(values) > 1:
		return "", badRequest(codeInvalidKey, "send exactly one Idempotency-Key header")
	}
	// The characters first: 128 Cyrillic letters are 256 bytes, and "at
	// most 128 characters" would not say what is wrong with them.
	for i := 0; i < len(values[0]); i++ {
		if c := values[0][i]; c < 0x20 || c > 0x7e {
			return "", badRequest(codeInvalidKey, "Idempotency-Key must be printable ASCII")
		}
	}
	if len(values[0]) > maxIdempotencyKey {
		return "", badRequest(codeInvalidKey, "Idempotency-Key must be at most 128 characters")
	}
	if apikey.ContainsKeySecret(values[0]) {
		// Returned with its refusal, so that the call's line says
		// "[holds an API key]" where the key would have been.
		return values[0], badRequest(codeInvalidKey, "Idempotency-Key "+holdsAPIKey)
	}
	return values[0], nil
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := httpserver.ReadBody(w, r, maxBodyBytes)
	switch {
	case errors.Is(err, httpserver.ErrBodyTooLarge), errors.Is(err, httpserver.ErrBodyAbandoned):
		return nil, err // 413 or 499, answered by writeError
	case err != nil:
		return nil, badRequest(codeInvalidBody, "the body could not be read")
	}
	return body, nil
}

// parseBody reads a SaleWriteRequest (spec 2.5) strictly: one JSON object,
// nothing after it, no duplicate and no unknown property. It returns the
// external order id and the quantity with its default applied.
func parseBody(body []byte) (string, int, error) {
	// strictjson.CheckObject refuses invalid UTF-8, a lone surrogate escape
	// (read as U+FFFD, "\ud800" and "\udfff" would name the same order),
	// duplicate names and data after the object, and names the fault, so
	// the walk below reads a well-formed object: jsontext's decoder, in one
	// pass without a copy of the body (bytes.Buffer) and without tracking
	// names again. encoding/json's Decoder, its tokens and the Unmarshal of
	// the order id scanned the body three more times: 2.2 against 0.5 µs
	// and 21 against 8 allocations for a usual body.
	if fault := strictjson.CheckObject(body); fault != nil {
		return "", 0, invalidJSON(fault)
	}
	dec := jsontext.NewDecoder(bytes.NewBuffer(body), jsontext.AllowDuplicateNames(true))
	if _, err := dec.ReadToken(); err != nil {
		return "", 0, badRequest(codeInvalidBody, "the body is not valid JSON")
	}
	var orderID *string
	for dec.PeekKind() == '"' {
		name, value, err := nextProperty(dec)
		if err != nil {
			return "", 0, err
		}
		switch name {
		case "external_order_id":
			s, err := externalOrderID(value)
			if err != nil {
				return "", 0, err
			}
			orderID = &s
		case "quantity":
			// Spec 2.5: "only value 1 is allowed; default 1".
			if !isOne(value) {
				return "", 0, badRequest(codeInvalidBody, "quantity must be the integer 1")
			}
		default:
			return "", 0, badRequest(codeInvalidBody, fmt.Sprintf("unknown property %q", clip(httpserver.LoggableClientValue(name))))
		}
	}
	if orderID == nil {
		return "", 0, badRequest(codeInvalidBody, "external_order_id is required")
	}
	return *orderID, sales.DefaultQuantity, nil
}

// isOne reports whether a JSON value is the number 1, however it is
// written: 1.0 and 1e0 are the integer 1 too (JSON Schema's "integer" is
// any number without a fractional part), and a client holding quantities
// as floats (PHP, Python's json.dumps(1.0)) writes them so. A string,
// null or any other number is not.
func isOne(value []byte) bool {
	// Short values only: big.Rat expands an exponent into that many digits
	// (0.<9,999 zeros>1e1000000 is 1, and costs 40 ms), and no client
	// writes 1 in more than a few characters.
	if len(value) == 0 || len(value) > maxQuantityLen || value[0] < '0' || value[0] > '9' {
		return false
	}
	// Nor a large exponent, which a short value holds as well: 1e999999
	// cost big.Rat 40 ms and 4 MB. In maxQuantityLen bytes, only an
	// exponent of at most that much can bring a number to 1.
	if i := bytes.IndexAny(value, "eE"); i >= 0 {
		if exp, err := strconv.Atoi(string(value[i+1:])); err != nil || exp < -maxQuantityLen || exp > maxQuantityLen {
			return false
		}
	}
	n, ok := new(big.Rat).SetString(string(value))
	return ok && n.Cmp(big.NewRat(1, 1)) == 0
}

// maxQuantityLen bounds the spelling of a quantity isOne reads.
const maxQuantityLen = 16

// invalidJSON answers a body strictjson refused, naming a repeated
// property (unless it holds something like an API key).
func invalidJSON(fault *strictjson.Fault) error {
	if fault.Duplicate != "" {
		return badRequest(codeInvalidBody, fmt.Sprintf("property %q appears twice", clip(httpserver.LoggableClientValue(fault.Duplicate))))
	}
	return badRequest(codeInvalidBody, fault.Message)
}

// nextProperty reads one name and its raw value.
func nextProperty(dec *jsontext.Decoder) (string, jsontext.Value, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return "", nil, badRequest(codeInvalidBody, "the body is not valid JSON")
	}
	name := tok.String() // before the next read, which voids tok
	value, err := dec.ReadValue()
	if err != nil {
		return "", nil, badRequest(codeInvalidBody, "the body is not valid JSON")
	}
	return name, value, nil
}

func externalOrderID(value jsontext.Value) (string, error) {
	if value.Kind() != '"' {
		return "", badRequest(codeInvalidBody, "external_order_id must be a string")
	}
	unquoted, err := jsontext.AppendUnquote(nil, value)
	if err != nil {
		return "", badRequest(codeInvalidBody, "external_order_id must be a string")
	}
	s := string(unquoted)
	if n := utf8.RuneCountInString(s); n < 1 || n > maxExternalOrderID {
		return "", badRequest(codeInvalidBody, "external_order_id must be 1 to 128 characters long")
	}
	if strings.ContainsRune(s, 0) {
		// PostgreSQL text cannot hold NUL.
		return "", badRequest(codeInvalidBody, "external_order_id must not contain NUL characters")
	}
	if apikey.ContainsKeySecret(s) {
		return "", badRequest(codeInvalidBody, "external_order_id "+holdsAPIKey)
	}
	return s, nil
}

// clip shortens a client-supplied name quoted back in a message.
func clip(s string) string {
	if utf8.RuneCountInString(s) <= maxNameInMessage {
		return s
	}
	return string([]rune(s)[:maxNameInMessage]) + "…"
}

// isUUID reports whether s is a UUID in its canonical text form.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'):
			return false
		}
	}
	return true
}
