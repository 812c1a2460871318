package catalog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/coinexport/export/pkg/strictjson"
)

// MaxLineBytes bounds one import line, so a file without newlines cannot
// exhaust memory.
const MaxLineBytes = 1 << 20

// LineError rejects an import file: the first bad line and why.
type LineError struct {
	Line   int
	Reason string
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// ParseJSONL reads a JSON Lines import file (one item per line, blank lines
// ignored) and validates all of it before returning: the first bad line is
// returned as a *LineError and no item is returned with it. The items come
// back canonical (sorted images, compact JSON objects with sorted keys).
// It holds the whole file's items; ImportJSONL streams a file instead.
func ParseJSONL(r io.Reader) ([]Item, error) {
	lines := NewLineReader(r)
	var items []Item
	for {
		it, err := lines.Next()
		if errors.Is(err, io.EOF) {
			return items, nil
		}
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
}

// LineReader reads the items of a JSON Lines import file one at a time,
// validating each line and that no id repeats an earlier line's. It keeps
// only the ids it has seen, so a catalog of a million items is read in
// tens of megabytes.
type LineReader struct {
	br   *bufio.Reader
	line int            // the last line read, 1-based
	seen map[string]int // id → the line it was on
}

// NewLineReader reads the file r.
func NewLineReader(r io.Reader) *LineReader {
	return &LineReader{br: bufio.NewReaderSize(r, 64<<10), seen: map[string]int{}}
}

// Next returns the next item, a *LineError for a bad line, io.EOF after
// the last item, or the reader's own error.
func (lr *LineReader) Next() (Item, error) {
	for {
		lr.line++
		line, err := readLine(lr.br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, errLineTooLong) {
				return Item{}, &LineError{Line: lr.line, Reason: err.Error()}
			}
			return Item{}, fmt.Errorf("catalog: read line %d: %w", lr.line, err)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			return lr.item(line)
		}
		if errors.Is(err, io.EOF) {
			return Item{}, io.EOF
		}
	}
}

func (lr *LineReader) item(line []byte) (Item, error) {
	it, reason := parseLine(line)
	if reason != "" {
		return Item{}, &LineError{Line: lr.line, Reason: reason}
	}
	if first, dup := lr.seen[it.ID]; dup {
		return Item{}, &LineError{Line: lr.line, Reason: fmt.Sprintf("id: %q already appears on line %d", it.ID, first)}
	}
	lr.seen[it.ID] = lr.line
	return it, nil
}

var errLineTooLong = fmt.Errorf("line longer than %d bytes", MaxLineBytes)

// readLine returns the next line without its line ending; io.EOF comes with
// the last (possibly empty) line.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLineBytes+2 {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) > MaxLineBytes {
			return nil, errLineTooLong
		}
		return line, err
	}
}

// parseLine validates one line; a non-empty reason rejects it.
func parseLine(line []byte) (Item, string) {
	// As strict as the API's bodies: encoding/json would keep the last of
	// two equal names and read a lone surrogate escape or invalid UTF-8 as
	// U+FFFD, so a line could store other data than it shows.
	if fault := strictjson.CheckObject(line); fault != nil {
		if fault.Duplicate != "" {
			return Item{}, fmt.Sprintf("the name %q appears twice in one object", fault.Duplicate)
		}
		return Item{}, strings.ReplaceAll(fault.Message, "the body", "the line")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return Item{}, "the line must be a JSON object"
	}
	for name := range fields {
		if reason, bad := forbiddenFields[name]; bad {
			return Item{}, name + ": " + reason
		}
		if !allowedFields[name] {
			return Item{}, name + ": unknown field"
		}
	}
	var it Item
	for _, step := range itemFields {
		if reason := step.parse(&it, fields[step.name]); reason != "" {
			return Item{}, step.name + ": " + reason
		}
	}
	if reason := checkStock(it.Status, fields["stock_quantity"]); reason != "" {
		return Item{}, "stock_quantity: " + reason
	}
	return it, ""
}

var allowedFields = map[string]bool{
	"id": true, "coin_id": true, "status": true, "price": true, "currency": true,
	"stock_quantity": true, "category": true, "characteristics": true, "images": true, "texts": true,
}

var forbiddenFields = map[string]string{
	"title":       "not allowed here; put it in texts.<LANG>.title",
	"description": "not allowed here; put it in texts.<LANG>.description",
	"updated_at":  "not allowed; the server sets it on every change",
}

// itemFields parses the fields in a fixed order, so the reported reason of a
// line with several problems is always the same one.
var itemFields = []struct {
	name  string
	parse func(*Item, json.RawMessage) string
}{
	{"id", func(it *Item, raw json.RawMessage) (r string) { it.ID, r = parseItemID(raw); return r }},
	{"coin_id", func(it *Item, raw json.RawMessage) (r string) { it.CoinID, r = parseCoinID(raw); return r }},
	{"status", func(it *Item, raw json.RawMessage) (r string) { it.Status, r = parseStatus(raw); return r }},
	{"price", func(it *Item, raw json.RawMessage) (r string) { it.Price, r = parsePrice(raw); return r }},
	{"currency", func(it *Item, raw json.RawMessage) (r string) { it.Currency, r = parseCurrency(raw); return r }},
	{"category", func(it *Item, raw json.RawMessage) (r string) { it.Category, r = parseCategory(raw); return r }},
	{"characteristics", func(it *Item, raw json.RawMessage) (r string) {
		it.Characteristics, r = parseCharacteristics(raw)
		return r
	}},
	{"images", func(it *Item, raw json.RawMessage) (r string) { it.Images, r = parseImages(raw); return r }},
	{"texts", func(it *Item, raw json.RawMessage) (r string) { it.Texts, r = parseTexts(raw); return r }},
}
