package prestashop

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"
)

// Int is a PrestaShop integer field. Depending on the version and the PHP
// database driver it arrives as a number (12), a string ("12"), an empty
// string for a null id_ field, or null.
type Int int64

// UnmarshalJSON accepts a number, a numeric string, "", true/false or null.
func (n *Int) UnmarshalJSON(b []byte) error {
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
	case float64:
		if x != float64(int64(x)) {
			return fmt.Errorf("prestashop: %v is not an integer", x)
		}
		*n = Int(x)
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
		var vs []LangValue
		if err := json.Unmarshal(b, &vs); err != nil {
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

// utf8BOM is stripped: a stray BOM in a PHP file of the shop precedes every
// answer, and is otherwise harmless.
var utf8BOM = []byte("\xef\xbb\xbf")

// looksLikeJSON reports whether body starts like a JSON object or array.
func looksLikeJSON(body []byte) bool {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))
	return len(body) > 0 && (body[0] == '{' || body[0] == '[')
}

// decodeList decodes a list answer: {"<resource>":[...]} or, for an empty
// list, a bare [] (PrestaShop's JSON renderer drops the wrapper then).
func decodeList[T any](body []byte, resource string) ([]T, error) {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))
	if len(body) > 0 && body[0] == '[' {
		var raw []json.RawMessage
		if err := json.Unmarshal(body, &raw); err != nil {
			return nil, err
		}
		if len(raw) != 0 {
			return nil, fmt.Errorf("prestashop: %s answer is a non-empty bare array", resource)
		}
		return nil, nil
	}
	var wrapper map[string]json.RawMessage
	if err := json.Unmarshal(body, &wrapper); err != nil {
		return nil, err
	}
	raw, ok := wrapper[resource]
	if !ok {
		return nil, fmt.Errorf("prestashop: %s answer lacks the %q member", resource, resource)
	}
	var items []T
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, err
	}
	return items, nil
}

// shopErrors decodes {"errors":[{"code":..,"message":..}]} and returns the
// codes; the messages are never used, since they are the shop's words.
func shopErrors(body []byte) []int {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))
	if bytes.HasPrefix(body, []byte("<")) {
		return shopErrorsXML(body)
	}
	var e struct {
		Errors []struct {
			Code Int `json:"code"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return nil
	}
	codes := make([]int, 0, len(e.Errors))
	for _, x := range e.Errors {
		codes = append(codes, int(x.Code))
	}
	return codes
}

// shopErrorsXML reads the codes of PrestaShop's XML error answer
// (<prestashop><errors><error><code><![CDATA[20]]></code>...), which a shop
// sends when it answers before reading output_format: a wrong key is still
// a wrong key, whatever the format says it.
func shopErrorsXML(body []byte) []int {
	var e struct {
		Errors []struct {
			Code string `xml:"code"`
		} `xml:"errors>error"`
	}
	if err := xml.Unmarshal(body, &e); err != nil {
		return nil
	}
	var codes []int
	for _, x := range e.Errors {
		if c, err := strconv.Atoi(strings.TrimSpace(x.Code)); err == nil {
			codes = append(codes, c)
		}
	}
	return codes
}
