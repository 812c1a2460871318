// Package catalog owns export items as they are written: the JSON Lines
// import format, validation, the per-language rendering of each item's
// static JSON, the upsert into PostgreSQL and the synthetic seed. It also
// owns the one function that composes a stored document into an ExportItem
// (spec 2.2), so the storage format lives in one place.
//
// # Import format
//
// One JSON object per line (blank lines ignored, at most MaxLineBytes each),
// for example:
//
//	{"id":"coin-1","coin_id":"K-7","status":"active","price":120.5,"currency":"UAH","category":{"id":"silver"},"characteristics":{"year":1780},"images":[{"id":"i1","url":"https://img.example/1.jpg","position":1,"type":"obverse"}],"texts":{"ENG":{"title":"Thaler","description":"Old"},"RUS":{"title":"Талер"}}}
//
// The fields:
//
//   - id: string, 1–128 characters, no control characters or surrounding
//     white space, unique in the file; the upsert key within the owner.
//     Clients put it in URLs as one path segment, so it must not contain "/"
//     or "\" nor be "." or "..", nor hold an API key, which the gateway
//     refuses in a URL (ValidItemID holds the whole rule).
//   - status: active or inactive (the owner's listing switch; a sold item
//     stays inactive). stock_quantity may be given only as the matching 1 or 0.
//   - currency: ISO 4217 code. price: number ≥ 0, below 10^14, at most 4
//     decimals and 15 significant digits (a double holds it exactly), or
//     null/absent. coin_id: string or null/absent.
//   - category: object or null/absent. characteristics: object, {} when absent.
//     Their numbers must fit a double (1e400 is refused: it is Infinity to
//     JavaScript and an error to encoding/json) and PostgreSQL's numeric, at
//     most 16383 digits after the point (1e-16384 is refused), with an
//     exponent within ±1073741822 (0e1073741823 is refused), and they nest
//     at most 64 levels of objects and arrays (a page with one item deeper
//     than a client's parser allows is unreadable to it as a whole: Ruby's
//     JSON stops at 100 levels, PHP's json_decode at 512).
//   - images: array (≤ 100) of {id, url (absolute https URI, its scheme
//     stored in lower case, HTTPS://… as https://…; no user info;
//     only the characters RFC 3986 allows, so a non-ASCII path is
//     percent-encoded and a non-ASCII host written in its xn-- form, each
//     '%' starts two hex digits, '#' comes once at most, '[' and ']' only
//     around an IPv6 host; a port from 1 to 65535), position (0–1000000,
//     unique), type (obverse, reverse, edge, gallery)}, stored ordered by
//     position; [] when absent.
//   - texts: ENG required, RUS and UKR optional (absent or null), each {title (required,
//     ≤ 500 characters, one line), description (optional, ≤ 20000)}. A
//     missing translation or description falls back to ENG when rendered.
//   - title, description and updated_at at the top level are refused, and so
//     is any unknown field.
//
// ParseJSONL checks the whole file before anything is written and reports the
// first bad line as a *LineError ("line 7: price: must be …").
package catalog

import "encoding/json"

// Languages are the content languages of spec 1, in storage order
// (doc_eng, doc_rus, doc_ukr).
var Languages = []string{"ENG", "RUS", "UKR"}

// Lang is the default language and the fallback of a missing translation.
const Lang = "ENG"

// Statuses of an export item (spec 3).
const (
	StatusActive   = "active"
	StatusInactive = "inactive"
)

// Image types of spec 2.3.
var ImageTypes = []string{"obverse", "reverse", "edge", "gallery"}

// Item is one import line: the ExportItem fields of spec 2.2 except title,
// description and updated_at, plus the localized texts. Values are already
// validated and canonical when they come from ParseJSONL.
type Item struct {
	ID     string
	CoinID *string // nil: null
	// Status is the owner's listing switch (active or inactive). A sold item
	// stays inactive whatever the import says: the exported status is derived
	// from this and the sale state in the database.
	Status string
	Price  *json.Number // nil: null; canonical decimal, at most 4 fractional digits
	// Currency is an ISO 4217 code.
	Currency string
	// Category is a JSON object or nil (null), compact with sorted keys.
	Category json.RawMessage
	// Characteristics is a JSON object (never nil once parsed), compact with sorted keys.
	Characteristics json.RawMessage
	// Images are ordered by Position.
	Images []Image
	// Texts maps a language (ENG required, RUS and UKR optional) to its texts.
	Texts map[string]Text
}

// Text is the title and description of an item in one language.
type Text struct {
	Title       string `json:"title"`
	Description string `json:"description,omitempty"`
}

// Image is an image of spec 2.3.
type Image struct {
	ID       string `json:"id"`
	URL      string `json:"url"`
	Position int    `json:"position"`
	Type     string `json:"type"`
}

// text returns the texts of lang with ENG filling whatever the translation
// lacks: a missing translation, or a translation without a description.
func (it *Item) text(lang string) Text {
	eng := it.Texts[Lang]
	t, ok := it.Texts[lang]
	if !ok {
		return eng
	}
	if t.Description == "" {
		t.Description = eng.Description
	}
	return t
}
