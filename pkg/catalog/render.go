package catalog

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// TimeLayout is how updated_at is written: RFC 3339, UTC, always six
// fractional digits (PostgreSQL keeps microseconds), so the strings sort in
// time order and round-trip exactly into updated_after.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

// Render returns the stored document of it in lang: the members of its
// ExportItem object without the surrounding braces and without status,
// stock_quantity and updated_at, which Compose adds from the row when it is
// read. A missing translation (or a missing description) falls back to ENG,
// so every language always has a document.
func Render(it *Item, lang string) []byte {
	return AppendDoc(make([]byte, 0, 512+64*len(it.Images)), it, lang)
}

// AppendDoc appends the document of Render to dst.
func AppendDoc(dst []byte, it *Item, lang string) []byte {
	t := it.text(lang)
	dst = append(dst, `"id":`...)
	dst = appendString(dst, it.ID)
	dst = append(dst, `,"coin_id":`...)
	if it.CoinID == nil {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, *it.CoinID)
	}
	dst = append(dst, `,"title":`...)
	dst = appendString(dst, t.Title)
	dst = append(dst, `,"description":`...)
	dst = appendString(dst, t.Description)
	dst = append(dst, `,"price":`...)
	if it.Price == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, *it.Price...)
	}
	dst = append(dst, `,"currency":`...)
	dst = appendString(dst, it.Currency)
	dst = append(dst, `,"category":`...)
	dst = appendRaw(dst, it.Category, "null")
	dst = append(dst, `,"characteristics":`...)
	dst = appendRaw(dst, it.Characteristics, "{}")
	dst = append(dst, `,"images":[`...)
	for i, img := range it.Images {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendImage(dst, img)
	}
	return append(dst, ']')
}

func appendImage(dst []byte, img Image) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, img.ID)
	dst = append(dst, `,"url":`...)
	dst = appendString(dst, img.URL)
	dst = append(dst, `,"position":`...)
	dst = strconv.AppendInt(dst, int64(img.Position), 10)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, img.Type)
	return append(dst, '}')
}

func appendRaw(dst, raw []byte, empty string) []byte {
	if len(raw) == 0 {
		return append(dst, empty...)
	}
	return append(dst, raw...)
}

// Compose appends one ExportItem to dst: the row's status, the stock derived
// from it (spec 3: 1 when active, 0 when sold or inactive), updated_at, and
// the stored document. It is the read path's only per-item work.
func Compose(dst []byte, status string, updatedAt time.Time, doc []byte) []byte {
	if status == StatusActive {
		dst = append(dst, `{"status":"active","stock_quantity":1,"updated_at":"`...)
	} else {
		dst = append(dst, `{"status":"inactive","stock_quantity":0,"updated_at":"`...)
	}
	dst = updatedAt.UTC().AppendFormat(dst, TimeLayout)
	dst = append(dst, `",`...)
	dst = append(dst, doc...)
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Input is valid UTF-8 (the parser
// checks it); U+2028 and U+2029 are escaped so the output is also safe to
// embed in JavaScript.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == '\u2028' || r == '\u2029' || r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				if r == utf8.RuneError {
					dst = append(dst, `\ufffd`...)
				} else {
					dst = append(dst, `\u202`...)
					dst = append(dst, hexDigits[r&0xf])
				}
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
