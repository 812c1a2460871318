// Package strictjson checks a request body before encoding/json reads it:
// exactly one JSON object, valid UTF-8, no lone surrogate escape, no name
// twice in an object, nothing after it. encoding/json would keep the last of
// two equal names and read invalid UTF-8 and lone surrogate escapes as
// U+FFFD, so two different bodies could name the same order, key or
// address. The checks are jsontext's (github.com/go-json-experiment/json,
// RFC 8259 and RFC 7493 strictly); this package only says which one failed.
package strictjson

import (
	"bytes"
	"errors"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// Fault says which rule a body breaks.
type Fault struct {
	// Message is a fixed phrase naming the rule; it quotes nothing of the
	// body.
	Message string
	// Duplicate is the name that appears twice, when that is the fault.
	// A caller quotes it only where a name cannot hold a secret.
	Duplicate string
}

// CheckObject returns nil when body is exactly one valid JSON object, and
// otherwise the rule it breaks. A valid body costs one pass of jsontext's
// validator and no allocation.
func CheckObject(body []byte) *Fault {
	if jsontext.Value(body).IsValid() && startsObject(body) {
		return nil
	}
	return diagnose(body)
}

// diagnose reads a refused body again to name its fault.
func diagnose(body []byte) *Fault {
	if fault := encodingFault(body); fault != nil {
		return fault
	}
	// An HTTP/1.0 POST without Content-Length, or a client that sent its
	// body nowhere, was told "must be a JSON object", which sent its sender
	// looking at a JSON it had written.
	if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
		return &Fault{Message: "the body is empty: send a JSON object"}
	}
	if !startsObject(body) {
		return &Fault{Message: "the body must be a JSON object"}
	}
	_, err := jsontext.NewDecoder(bytes.NewReader(body)).ReadValue()
	var syntax *jsontext.SyntacticError
	switch {
	case err == nil:
		return &Fault{Message: "unexpected data after the JSON object"}
	case errors.Is(err, jsontext.ErrDuplicateName) && errors.As(err, &syntax):
		return &Fault{Message: "a property appears twice in the body", Duplicate: syntax.JSONPointer.LastToken()}
	case !utf8.Valid(body):
		return &Fault{Message: "the body is not valid UTF-8"}
	case jsontext.Value(body).IsValid(jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true)):
		// Valid UTF-8 that is valid JSON only when strings may be mangled:
		// an escape names half of a surrogate pair.
		return &Fault{Message: `a string in the body holds a lone surrogate escape (\ud800 to \udfff not in a pair)`}
	}
	return &Fault{Message: "the body is not valid JSON"}
}

// encodingFault names a body sent in another encoding than UTF-8, or with
// a byte order mark, which RFC 8259 (8.1) rules out for JSON on a network:
// "must be a JSON object" would send its sender looking at its JSON, when
// its HTTP client or serializer (.NET, PowerShell) is what to change.
func encodingFault(body []byte) *Fault {
	const useUTF8 = "; send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)"
	switch {
	case bytes.HasPrefix(body, []byte{0xEF, 0xBB, 0xBF}):
		return &Fault{Message: "the body starts with a byte order mark" + useUTF8}
	case bytes.HasPrefix(body, []byte{0xFF, 0xFE, 0, 0}), bytes.HasPrefix(body, []byte{0, 0, 0xFE, 0xFF}):
		return &Fault{Message: "the body is UTF-32 (it starts with a byte order mark)" + useUTF8}
	case bytes.HasPrefix(body, []byte{0xFE, 0xFF}), bytes.HasPrefix(body, []byte{0xFF, 0xFE}):
		return &Fault{Message: "the body is UTF-16 (it starts with a byte order mark)" + useUTF8}
	case len(body) >= 2 && (body[0] == 0 || body[1] == 0):
		// JSON starts with an ASCII character; a NUL beside it is the
		// other half of a UTF-16 or UTF-32 code unit.
		return &Fault{Message: "the body is UTF-16 or UTF-32 (NUL bytes around its first character)" + useUTF8}
	}
	return nil
}

// startsObject reports whether the first byte after white space opens an
// object.
func startsObject(body []byte) bool {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] == '{'
}
