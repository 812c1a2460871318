package catalog

import (
	"strconv"
	"time"

	"github.com/coinexport/export/pkg/jsonw"
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
	return appendDoc(make([]byte, 0, 512+64*len(it.Images)), it, lang)
}

// appendDoc appends the document of Render to dst.
func appendDoc(dst []byte, it *Item, lang string) []byte {
	t := it.text(lang)
	dst = append(dst, `"id":`...)
	dst = jsonw.String(dst, it.ID)
	dst = append(dst, `,"coin_id":`...)
	if it.CoinID == nil {
		dst = append(dst, "null"...)
	} else {
		dst = jsonw.String(dst, *it.CoinID)
	}
	dst = append(dst, `,"title":`...)
	dst = jsonw.String(dst, t.Title)
	dst = append(dst, `,"description":`...)
	dst = jsonw.String(dst, t.Description)
	dst = append(dst, `,"price":`...)
	if it.Price == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, *it.Price...)
	}
	dst = append(dst, `,"currency":`...)
	dst = jsonw.String(dst, it.Currency)
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
	dst = jsonw.String(dst, img.ID)
	dst = append(dst, `,"url":`...)
	dst = jsonw.String(dst, img.URL)
	dst = append(dst, `,"position":`...)
	dst = strconv.AppendInt(dst, int64(img.Position), 10)
	dst = append(dst, `,"type":`...)
	dst = jsonw.String(dst, img.Type)
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
