package prestashop

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"
)

// Int is a PrestaShop integer field. Depending on the version and the PHP
// database driver it arrives as a number (12), a string ("12"), an empty
// string for a null id_ field, or null.
type Int int64

// UnmarshalJSON accepts a number, a numeric string, "", true/false or null.
func (n *Int) UnmarshalJSON(b []byte) error {
	if b = bytes.TrimSpace(b); len(b) > 0 && (b[0] == '-' || '0' <= b[0] && b[0] <= '9') {
		i, err := integer(string(b))
		if err != nil {
			return err
		}
		*n = Int(i)
		return nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		*n = 0
	case bool:
		*n = 0
		if x {
			*n = 1
		}
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			*n = 0
			return nil
		}
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("prestashop: %q is not an integer", s)
		}
		*n = Int(i)
	default:
		return fmt.Errorf("prestashop: an integer field holds %T", v)
	}
	return nil
}

// integer reads a JSON number as an int64, exactly: read through float64,
// an id beyond 2^53 came back rounded (1000000000001000000 as
// 1000000000000999936), and two ids as one.
func integer(s string) (int64, error) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	// 12.0 or 1.2e1 is an integer too. big.Rat writes 10^exp out in full
	// (1e999999 costs it 40 ms), so the spelling is bounded first: at most
	// 32 characters and an exponent of at most 32 either way, limits chosen
	// wide of any spelling a shop's PHP writes ("12.0", "1.2e1"), not
	// derived (a few exotic ones within them are refused, "0e99" among
	// them).
	_, exp, _ := strings.Cut(strings.ToLower(s), "e")
	if e, err := strconv.Atoi(exp); len(s) <= 32 && (exp == "" || err == nil && -32 <= e && e <= 32) {
		if r, ok := new(big.Rat).SetString(s); ok && r.IsInt() && r.Num().IsInt64() {
			return r.Num().Int64(), nil
		}
	}
	return 0, fmt.Errorf("prestashop: %s is not an integer", s)
}

// Bool is a PrestaShop boolean field: "0"/"1", 0/1, true/false, "" or null.
type Bool bool

// UnmarshalJSON accepts the forms listed on Bool.
func (p *Bool) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		*p = false
	case bool:
		*p = Bool(x)
	case float64:
		*p = x != 0
	case string:
		s := strings.TrimSpace(x)
		*p = Bool(s != "" && s != "0" && !strings.EqualFold(s, "false"))
	default:
		return fmt.Errorf("prestashop: a boolean field holds %T", v)
	}
	return nil
}

// String is a PrestaShop text field that may also arrive as a number.
type String string

// UnmarshalJSON accepts a string, a number or null.
func (s *String) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		*s = ""
	case string:
		*s = String(x)
	case float64, bool:
		*s = String(strings.TrimSpace(string(b)))
	default:
		return fmt.Errorf("prestashop: a text field holds %T", v)
	}
	return nil
}

// LangValue is one language's text of a multilingual field.
type LangValue struct {
	LanguageID Int    `json:"id"`
	Value      String `json:"value"`
}

// Text is a multilingual field. With two or more languages rendered it is
// [{"id":"1","value":"..."}]; with exactly one (a single-language shop, or
// a language= parameter) it is a plain string, kept in Plain.
type Text struct {
	Plain   string
	IsPlain bool
	ByLang  []LangValue
}

// UnmarshalJSON accepts both forms, and null.
func (t *Text) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || bytes.Equal(b, []byte("null")):
		*t = Text{}
	case b[0] == '[':
		vs, err := decodeLangValues(b)
		if err != nil {
			return err
		}
		*t = Text{ByLang: vs}
	default:
		var s String
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*t = Text{Plain: string(s), IsPlain: true}
	}
	return nil
}

// maxLangValues bounds the values of one multilingual field. PrestaShop
// writes one per language of the shop, and no shop has a thousand; a field
// of more is a shop making each row hold much more than its bytes ({} is a
// LangValue of 24 bytes), which the call's budget could not stop in time.
const maxLangValues = 1000

// decodeLangValues decodes the [{"id":..,"value":..}] form of a Text, one
// value at a time, so that an over-long field is refused before it is held.
func decodeLangValues(b []byte) ([]LangValue, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // [
		return nil, err
	}
	vs := []LangValue{}
	for dec.More() {
		if len(vs) == maxLangValues {
			return nil, fmt.Errorf("prestashop: a multilingual field has more than %d values", maxLangValues)
		}
		var v LangValue
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// heldBytes is about what a decoded Text holds in memory.
func (t Text) heldBytes() int64 {
	n := len(t.Plain) + cap(t.ByLang)*int(unsafe.Sizeof(LangValue{}))
	for _, v := range t.ByLang {
		n += len(v.Value)
	}
	return int64(n)
}

// Language is an entry of /api/languages.
type Language struct {
	ID           Int    `json:"id"`
	Name         String `json:"name"`
	ISOCode      String `json:"iso_code"`
	LanguageCode String `json:"language_code"`
	Locale       String `json:"locale"`
	Active       Bool   `json:"active"`
}

// Category is an entry of /api/categories.
type Category struct {
	ID             Int  `json:"id"`
	ParentID       Int  `json:"id_parent"`
	LevelDepth     Int  `json:"level_depth"`
	Active         Bool `json:"active"`
	Position       Int  `json:"position"`
	IsRootCategory Bool `json:"is_root_category"`
	Name           Text `json:"name"`
}

// Feature is an entry of /api/product_features.
type Feature struct {
	ID       Int  `json:"id"`
	Position Int  `json:"position"`
	Name     Text `json:"name"`
}

// FeatureValue is an entry of /api/product_feature_values.
type FeatureValue struct {
	ID        Int  `json:"id"`
	FeatureID Int  `json:"id_feature"`
	Custom    Bool `json:"custom"`
	Value     Text `json:"value"`
}

// row is an entry of a list: heldBytes is about what it holds in memory
// once decoded, which the call's budget is charged.
type row interface{ heldBytes() int64 }

func (l Language) heldBytes() int64 {
	return int64(unsafe.Sizeof(l)) + int64(len(l.Name)+len(l.ISOCode)+len(l.LanguageCode)+len(l.Locale))
}

func (c Category) heldBytes() int64 { return int64(unsafe.Sizeof(c)) + c.Name.heldBytes() }

func (f Feature) heldBytes() int64 { return int64(unsafe.Sizeof(f)) + f.Name.heldBytes() }

func (v FeatureValue) heldBytes() int64 { return int64(unsafe.Sizeof(v)) + v.Value.heldBytes() }

// utf8BOM is stripped: a stray BOM in a PHP file of the shop precedes every
// answer, and is otherwise harmless.
var utf8BOM = []byte("\xef\xbb\xbf")

// looksLikeJSON reports whether body starts like a JSON object or array.
func looksLikeJSON(body []byte) bool {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))
	return len(body) > 0 && (body[0] == '{' || body[0] == '[')
}

// decodeList decodes a list answer: {"<resource>":[...]} or, for an empty
// list, a bare [] (PrestaShop's JSON renderer drops the wrapper then). Each
// row is charged to budget, what the call may still hold, as it is
// decoded, and decoding stops with errCallBytesSpent once budget is spent:
// a row can hold a hundred times its bytes ({} is a Category of 88), so an
// answer under its byte cap could otherwise fill the memory of the process.
func decodeList[T row](body []byte, resource string, budget *atomic.Int64) ([]T, error) {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))
	if len(body) > 0 && body[0] == '[' {
		// Only an empty list comes bare. Anything else is refused unread:
		// decoded, an array of a million 1s would hold a hundred times its
		// bytes, out of the budget's sight.
		if !json.Valid(body) || len(bytes.TrimLeft(body[1:], " \t\r\n")) != 1 {
			return nil, fmt.Errorf("prestashop: %s answer is a bare array that is not empty", resource)
		}
		return nil, nil
	}
	dec := objectIn(body)
	if dec == nil {
		return nil, fmt.Errorf("prestashop: %s answer is not a valid JSON object", resource)
	}
	var items []T
	found := false
	for nextMember(dec, resource) { // the last one counts, as in encoding/json
		var err error
		if items, err = decodeRows[T](dec, resource, budget); err != nil {
			return nil, err
		}
		found = true
	}
	if !found {
		return nil, fmt.Errorf("prestashop: %s answer lacks the %q member", resource, resource)
	}
	return items, nil
}

// objectIn returns a decoder inside the JSON object body (past its '{'), or
// nil when body is not valid JSON or not an object. Checked valid first,
// the members it is then walked through (nextMember) never fail to read.
func objectIn(body []byte) *json.Decoder {
	if !json.Valid(body) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, _ := dec.Token(); tok != json.Delim('{') {
		return nil
	}
	return dec
}

// nextMember moves dec, inside an object from objectIn, past the members
// not named name to the value of the next one named name, a member at a
// time (none is held whole but that value); false at the object's end.
func nextMember(dec *json.Decoder, name string) bool {
	for dec.More() {
		if tok, _ := dec.Token(); tok == name {
			return true
		}
		var skipped json.RawMessage
		if dec.Decode(&skipped) != nil {
			return false
		}
	}
	return false
}

// decodeRows decodes the array of rows (or null) that dec is at, charging
// each row to budget.
func decodeRows[T row](dec *json.Decoder, resource string, budget *atomic.Int64) ([]T, error) {
	switch tok, _ := dec.Token(); tok {
	case nil:
		return nil, nil
	case json.Delim('['):
	default:
		return nil, fmt.Errorf("prestashop: the %q member is not an array", resource)
	}
	var items []T
	for dec.More() {
		var item T
		if err := dec.Decode(&item); err != nil {
			return nil, err
		}
		// The row's size counts twice: the slice it joins grows by
		// doubling.
		if budget.Add(-item.heldBytes()-int64(unsafe.Sizeof(item))) < 0 {
			return nil, errCallBytesSpent
		}
		items = append(items, item)
	}
	_, err := dec.Token() // ]
	return items, err
}

// maxShopErrors is how many error codes of a shop's answer are read:
// PrestaShop sends one or two, and an answer of millions would otherwise be
// held whole to find them.
const maxShopErrors = 16

// shopErrors decodes {"errors":[{"code":..,"message":..}]} and returns the
// codes (the first maxShopErrors); the messages are never used, since they
// are the shop's words. An answer that is not valid JSON has none.
func shopErrors(body []byte) []int {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))
	if bytes.HasPrefix(body, []byte("<")) {
		return shopErrorsXML(body)
	}
	if dec := objectIn(body); dec != nil && nextMember(dec, "errors") {
		return errorCodes(dec)
	}
	return nil
}

// errorCodes reads the codes of the array of errors dec is at, one error at
// a time.
func errorCodes(dec *json.Decoder) []int {
	if tok, _ := dec.Token(); tok != json.Delim('[') {
		return nil
	}
	var codes []int
	for dec.More() && len(codes) < maxShopErrors {
		var e struct {
			Code Int `json:"code"`
		}
		if dec.Decode(&e) != nil {
			return nil
		}
		codes = append(codes, int(e.Code))
	}
	return codes
}

// shopErrorsXML reads the codes of PrestaShop's XML error answer
// (<prestashop><errors><error><code><![CDATA[20]]></code>...), which a shop
// sends when it answers before reading output_format: a wrong key is still
// a wrong key, whatever the format says it. The first maxShopErrors are
// read, an element at a time; malformed XML before them has none.
func shopErrorsXML(body []byte) []int {
	dec := xml.NewDecoder(bytes.NewReader(body))
	var codes []int
	var open []string // the names of the elements the decoder is in
	for len(codes) < maxShopErrors {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if len(open) == 2 && open[1] == "errors" && t.Name.Local == "error" {
				var e struct {
					Code string `xml:"code"`
				}
				if dec.DecodeElement(&e, &t) != nil {
					return nil
				}
				if c, err := strconv.Atoi(strings.TrimSpace(e.Code)); err == nil {
					codes = append(codes, c)
				}
				continue
			}
			open = append(open, t.Name.Local)
		case xml.EndElement:
			open = open[:max(len(open)-1, 0)]
		}
	}
	return codes
}
