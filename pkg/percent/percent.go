// Package percent decodes %-escapes leniently, for the searches of secrets
// in text a client or a shop wrote: url.PathUnescape gives up at the first
// '%' without two hex digits after it, so a key encoded beside a "%zz"
// would go unseen.
package percent

import "strings"

// DecodeLeniently decodes every valid %XX of s and keeps any other byte as
// it is, a '%' without two hex digits after it included. s itself comes
// back, not a copy, when it has no valid escape.
func DecodeLeniently(s string) string {
	escape := func(i int) bool { return s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) }
	first := 0
	for first < len(s) && !escape(first) {
		first++
	}
	if first == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:first])
	for i := first; i < len(s); i++ {
		if escape(i) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// HoldsDecoded reports whether holds is true of s as written or of s
// decoded again while decoding changes it (DecodeLeniently), up to rounds
// times: a secret escaped twice ("%2541" is "%41" is "A") is read by
// whoever decodes twice. Text still changing after rounds decodings
// counts as holding it: no client or shop needs that many, and it hides
// what it holds from a bounded search.
func HoldsDecoded(s string, rounds int, holds func(string) bool) bool {
	for range rounds + 1 {
		if holds(s) {
			return true
		}
		decoded := DecodeLeniently(s)
		if decoded == s {
			return false
		}
		s = decoded
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
