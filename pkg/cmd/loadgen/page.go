package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/coinexport/export/pkg/envelope"
)

// page is what a syncing client needs from one list response.
type page struct {
	Items      int
	NextCursor string // "" on the last page
	Error      *envelope.ErrorBody
}

var errMalformed = errors.New("malformed JSON")

// scanPage reads a list envelope without decoding the items: it counts the
// elements of "data" and decodes only "meta" and "error". A full decode of
// ~1.5 KB items would cost the load generator more CPU than the server
// spends producing them, and the load generator shares the machine's cores
// with the stack; the bytes are still walked end to end, so a truncated or
// broken body is caught.
func scanPage(b []byte) (page, error) {
	var p page
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return p, fmt.Errorf("%w: body is not an object", errMalformed)
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return p, nil
	}
	for {
		keyEnd, err := skipValue(b, i)
		if err != nil || b[i] != '"' {
			return p, fmt.Errorf("%w: bad key at %d", errMalformed, i)
		}
		var key string
		if err := json.Unmarshal(b[i:keyEnd], &key); err != nil {
			return p, fmt.Errorf("%w: bad key at %d", errMalformed, i)
		}
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return p, fmt.Errorf("%w: missing colon at %d", errMalformed, i)
		}
		i = skipSpace(b, i+1)
		var end int
		if key == "data" {
			// Counted in the same walk that skips it: the array is
			// nearly the whole body.
			p.Items, end, err = countArray(b, i)
		} else {
			end, err = skipValue(b, i)
			if err == nil {
				err = p.member(key, b[i:end])
			}
		}
		if err != nil {
			return p, err
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return p, fmt.Errorf("%w: unterminated object", errMalformed)
		}
		if b[i] == '}' {
			if skipSpace(b, i+1) != len(b) {
				return p, fmt.Errorf("%w: trailing data", errMalformed)
			}
			return p, nil
		}
		if b[i] != ',' {
			return p, fmt.Errorf("%w: want , or } at %d", errMalformed, i)
		}
		i = skipSpace(b, i+1)
	}
}

// member takes one top-level member of the envelope other than data.
func (p *page) member(key string, v []byte) error {
	switch key {
	case "meta":
		var m envelope.Meta
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("%w: meta: %v", errMalformed, err)
		}
		if m.NextCursor != nil {
			p.NextCursor = *m.NextCursor
		}
	case "error":
		p.Error = &envelope.ErrorBody{}
		if err := json.Unmarshal(v, p.Error); err != nil {
			return fmt.Errorf("%w: error: %v", errMalformed, err)
		}
	}
	return nil
}

// countArray counts the elements of the JSON array at b[i] and returns the
// index just past it.
func countArray(b []byte, i int) (int, int, error) {
	if i >= len(b) || b[i] != '[' {
		return 0, 0, fmt.Errorf("%w: data is not an array", errMalformed)
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return 0, i + 1, nil
	}
	n := 0
	for {
		end, err := skipValue(b, i)
		if err != nil {
			return n, 0, err
		}
		n++
		i = skipSpace(b, end)
		if i >= len(b) {
			return n, 0, fmt.Errorf("%w: unterminated array", errMalformed)
		}
		if b[i] == ']' {
			return n, i + 1, nil
		}
		if b[i] != ',' {
			return n, 0, fmt.Errorf("%w: want , or ] at %d", errMalformed, i)
		}
		i = skipSpace(b, i+1)
	}
}

// skipValue returns the index just past the JSON value starting at b[i].
// Containers are matched by depth with strings skipped, which is all a
// counter needs; scalars end at the next delimiter.
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, fmt.Errorf("%w: value expected at end", errMalformed)
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("%w: unterminated container", errMalformed)
	default:
		j := i
		for j < len(b) && !isDelimiter(b[j]) {
			j++
		}
		if j == i {
			return 0, fmt.Errorf("%w: value expected at %d", errMalformed, i)
		}
		return j, nil
	}
}

// skipString returns the index just past the string starting at b[i]. Most
// of a page's bytes are inside strings, so it jumps from quote to quote
// (bytes.IndexByte is vectorised) and only then checks for an escape: a
// quote preceded by an odd number of backslashes is part of the string.
func skipString(b []byte, i int) (int, error) {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, fmt.Errorf("%w: unterminated string", errMalformed)
		}
		q := j + k
		backslashes := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return q + 1, nil
		}
		j = q + 1
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func isDelimiter(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ':'
}
