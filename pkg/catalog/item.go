// Package catalog owns export items as they are written: the JSON Lines
// import format, validation, the per-language rendering of each item's
// static JSON, the upsert into PostgreSQL and the synthetic seed. It also
// owns the one function that composes a stored document into an ExportItem
// (spec 2.2), so the storage format lives in one place.
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
