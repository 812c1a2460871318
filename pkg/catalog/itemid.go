package catalog

import (
	"errors"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
)

// MaxItemIDLen is the longest item id, in characters: the item_id domain's
// check (migration 00004).
const MaxItemIDLen = 128

// ValidItemID returns nil when id may be issued as an export item id, or an
// error whose text is the reason ("must not …", meant to follow the field's
// name). Clients address an item by its id as one path segment
// (/v1/export/items/{item_id}, …/sales/confirm), and many clients and
// proxies decode %2F to "/" or resolve dot segments before they send, and
// some turn "\" into "/" (the gateway answers a "." or ".." segment 404):
// an id with "/" or "\", or equal to "." or "..", could be listed but
// never read nor sold. So could an id holding an API key: the gateway
// refuses a URL with a key in it (spec 5), in any segment, as sent or
// %-decoded, and the key would sit in clear text in the catalog and in
// every sync page. The other rules keep what PostgreSQL and consumers can
// take.
//
// Every writer of new items calls it (ParseJSONL, Import); ids stored before
// the rule may break it, so readers looking an id up must not use it to
// refuse one.
func ValidItemID(id string) error {
	if reason := checkID(id); reason != "" {
		return errors.New(reason)
	}
	switch {
	case strings.ContainsAny(id, `/\`):
		return errors.New(`must not contain "/" or "\" (an item id is one URL path segment)`)
	case id == "." || id == "..":
		return errors.New(`must not be "." or ".." (an item id is one URL path segment)`)
	case apikey.PathHoldsKey(url.PathEscape(id)):
		// Read as a client sends it, escaped: the segment the gateway reads.
		// The reason never quotes the id, which holds a secret.
		return errors.New("must not hold an API key (the gateway refuses a URL with a key in it)")
	}
	return nil
}

// StorableItemID reports whether id could be the id of a stored item: 1 to
// MaxItemIDLen characters of valid UTF-8 without NUL, what the item_id
// column can hold. Readers call it to answer an id that cannot exist as not
// found without asking the database, which would only turn bad bytes into a
// database error.
//
// It is looser than ValidItemID on purpose: rows stored before that rule
// may hold ids it refuses ("/", surrounding spaces, control characters), and
// those items must still be readable and sellable.
func StorableItemID(id string) bool {
	return id != "" && utf8.ValidString(id) && utf8.RuneCountInString(id) <= MaxItemIDLen &&
		!strings.ContainsRune(id, 0)
}
