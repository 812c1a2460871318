// Package jsonw appends JSON text to a byte slice without reflection, for the
// hot paths that write the same few shapes millions of times (export
// documents, the sales writer's answers). Everything else uses encoding/json.
package jsonw

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// String appends s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json writes it; U+2028 and U+2029 are escaped so the output is
// also safe to embed in JavaScript. Unlike encoding/json, <, > and & are
// written as they are: the output goes to API clients, not into HTML.
func String(dst []byte, s string) []byte {
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
