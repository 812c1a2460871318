// Package apikey makes and checks API key secrets. A key looks like
//
//	cxr_<43 base62 chars of 32 random bytes><6 base62 chars of CRC-32>
//
// The leading tag tells a read key (cxr) from a write key (cxw) or a key with
// both scopes (cxa); the checksum lets secret scanners recognise a leaked key
// and lets the gateway refuse a mistyped one without a database lookup. Only
// the SHA-256 of a key is ever stored.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"math/big"
	"slices"
	"strings"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/percent"
)

const (
	alphabet    = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	bodyLen     = 43 // 32 bytes in base62
	checksumLen = 6  // 32 bits in base62
	tagLen      = 4  // "cxr_"
	// Len is the length of every well-formed key.
	Len = tagLen + bodyLen + checksumLen
	// displayLen is how much of a key is kept as its printable prefix.
	displayLen = tagLen + 8
)

// Tags by scope set.
const (
	TagRead  = "cxr_"
	TagWrite = "cxw_"
	TagAll   = "cxa_"
)

// inAlphabet tells the bytes of alphabet, for WellFormed's scan.
var inAlphabet = func() (in [256]bool) {
	for i := range len(alphabet) {
		in[alphabet[i]] = true
	}
	return in
}()

// Hash is the stored form of a key.
type Hash [sha256.Size]byte

// Generate returns a new secret for a key with the given scopes and its
// printable prefix, which identifies the key in listings without revealing it.
func Generate(scopes []string) (secret, prefix string, err error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", "", fmt.Errorf("apikey: random: %w", err)
	}
	tag := tagFor(scopes)
	body := base62(raw, bodyLen)
	sum := checksum(tag + body)
	secret = tag + body + string(sum[:])
	return secret, secret[:displayLen], nil
}

func tagFor(scopes []string) string {
	read, write := slices.Contains(scopes, identity.ScopeExportRead), slices.Contains(scopes, identity.ScopeSalesWrite)
	switch {
	case read && write:
		return TagAll
	case write:
		return TagWrite
	default:
		return TagRead
	}
}

// WellFormed reports whether s has the shape and checksum of a key. It says
// nothing of whether the key exists.
// It takes bytes too, without copying them (ContainsKey scans requests).
func WellFormed[T string | []byte](s T) bool {
	if len(s) != Len {
		return false
	}
	tag := string(s[:tagLen]) // compared only: no copy
	if tag != TagRead && tag != TagWrite && tag != TagAll {
		return false
	}
	for i := tagLen; i < Len; i++ {
		if !inAlphabet[s[i]] {
			return false
		}
	}
	sum := checksum(s[:Len-checksumLen])
	return string(sum[:]) == string(s[Len-checksumLen:])
}

// RedactPath returns path with every segment that holds a well-formed key
// (the whole segment or part of it: "x<key>", "<key>.json") replaced by
// "[key]", and whether there was one. The gateway refuses such a path
// (spec 5: keys never in URLs); what spans and logs record goes through
// RedactKeyLikePath. Each segment is read as sent and with its %-escapes
// decoded, so that an escaped letter hides no key, whatever the rest of
// the path holds. A path without one is returned as it is, and one without
// a key or a '%' also without an allocation (every request's path is read
// here).
func RedactPath(path string) (string, bool) {
	return redactParts(path, "/", wellFormedKeys)
}

// PathHoldsKey reports whether a segment of path holds a well-formed key,
// as RedactPath finds one: a request the gateway refuses (spec 5). It
// builds no string unless it finds one.
func PathHoldsKey(path string) bool {
	_, found := RedactPath(path)
	return found
}

// RedactKeyLikePath is RedactPath for what spans and logs record: it
// replaces the segments that hold anything ContainsKeyLike finds, a key
// mistyped or cut short included, and, when such text runs across
// segments, every segment from the first with a tag on.
func RedactKeyLikePath(path string) string {
	redacted, _ := redactParts(path, "/", keyLikeText)
	return redacted
}

// RedactKeyLikeHost is RedactKeyLikePath for a host name: each label that
// holds key-like text is "[key]" ("[key].shop.example"), and every label
// from the first with a tag on when such text runs across labels. A key
// typed into a host name is spelt with '-' for its '_' (a host name has no
// '_'), which ContainsKeyLike reads in any case, as DNS does; a whole
// key's secret, which HostHoldsKeySecret refuses (a refused request's log
// line names its host), also with nothing for its '_'.
func RedactKeyLikeHost(host string) string {
	redacted, _ := redactParts(host, ".", keyLikeHostText)
	return redacted
}

// HostHoldsKeySecret reports whether host holds a key's secret as a host
// name can spell it: the tag in any case with '-' (or '_', ' ') after it,
// or with nothing for it (hostTagsTyped), followed by a whole key's body
// within keySecretWindow bytes, in one word. A host is sent where no one
// can take it back (DNS resolvers, the TLS handshake, the Host header), so
// what holds one is refused, not redacted. Unlike ContainsKeySecret, a '.'
// or '-' within the body ends the count: a key typed into a host name has
// no reason to hold one, while real names are words joined by them, and
// counted across them, "cxa-numismatique-philatelie-collections.boutique.fr"
// read as a key. Before the body's first character they are the tag's own
// '_' ("cxr.<secret>", "cxr--<secret>"), and counted past. Other bytes are
// let in as ContainsKeySecret lets them (a Unicode hyphen for the '_' is
// three). Of a million generated shop hosts, a tenth of them with a random
// label of 46 to 63 characters, 14 are refused, each such a label that
// begins with "cxr", "cxw" or "cxa". What reads as a key across words is
// only redacted (RedactKeyLikeHost).
func HostHoldsKeySecret(host string) bool {
	return holdsKeyBodyInOneWord(hostTagsTyped(host))
}

// holdsKeyBodyInOneWord is HostHoldsKeySecret's count, after hostTagsTyped:
// holdsTaggedRun's loop with a word's end in it. Kept apart: a test of
// the break in that loop made BenchmarkContainsKeySecret, which every sale
// field's scan runs, 1.5 to 2 times as slow.
func holdsKeyBodyInOneWord(host string) bool {
	for i := 0; i+tagLen+bodyLen <= len(host); i++ {
		if !isKeyTag(host[i], host[i+1], host[i+2], host[i+3]) {
			continue
		}
		alphabetic := 0
		for j := i + tagLen; j < len(host) && j < i+tagLen+keySecretWindow; j++ {
			if inAlphabet[host[j]] {
				if alphabetic++; alphabetic >= bodyLen {
					return true
				}
			} else if alphabetic > 0 && (host[j] == '.' || host[j] == '-') {
				break // the word ends; one before the body is the tag's own ("cxr.<body>")
			}
		}
	}
	return false
}

// hostHoldsKeySecretLoosely is HostHoldsKeySecret counting across words,
// as ContainsKeySecret counts: a key with a '.' typed into it, or a real
// name that reads as one, is kept out of spans and logs.
func hostHoldsKeySecretLoosely(host string) bool {
	return holdsTaggedRun(hostTagsTyped(host), typedTags, bodyLen, keySecretWindow)
}

// hostTagsTyped returns host with a '-' after each tag's three letters
// (any case) that begin a word, at its start or after a byte out of the
// keys' alphabet ('.', '-'), and have no '_', '-' or ' ' after them: a
// key typed into a host name has nothing for its '_', or '-', or a Unicode
// hyphen, which IDNA keeps and its punycode leaves out ("cxr‐…" is sent as
// "xn--cxr…-…"), and the tag reads as typed then. Only where a word
// begins: "cxr", "cxw" or "cxa" is somewhere in about one random label of
// 63 letters and digits in 250.
func hostTagsTyped(host string) string {
	var b strings.Builder
	for i := 0; i < len(host); i++ {
		b.WriteByte(host[i])
		wordStart := i == 2 || i > 2 && !inAlphabet[host[i-3]]
		next := byte('.')
		if i+1 < len(host) {
			next = host[i+1]
		}
		if wordStart && isKeyTag(host[i-2], host[i-1], host[i], '_') && !isKeyTag(host[i-2], host[i-1], host[i], next) {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// keyFinder finds keys in text: holds reports one, and minLen is the
// shortest text it can find one in. acrossSegments: what it finds may run
// across a '/' (key-like text is counted past a typo; a key has no '/'),
// from the first segment that tagged reports a tag in.
type keyFinder struct {
	holds          func(string) bool
	minLen         int
	acrossSegments bool
	tagged         func(string) bool
}

var (
	wellFormedKeys  = keyFinder{holds: ContainsKey[string], minLen: untaggedLen} // a key without its tag is shortest
	keyLikeText     = keyFinder{holds: ContainsKeyLike[string], minLen: tagLen + minKeyLikeRun, acrossSegments: true, tagged: holdsKeyTag}
	keyLikeHostText = keyFinder{holds: func(host string) bool { return ContainsKeyLike(host) || hostHoldsKeySecretLoosely(host) },
		minLen: tagLen + minKeyLikeRun, acrossSegments: true, tagged: func(label string) bool { return holdsKeyTag(hostTagsTyped(label)) }}
)

// redactParts is RedactPath and its kin: path is split at sep (a path's
// "/", a host's "."), and each part that holds what keys finds is "[key]".
func redactParts(path, sep string, keys keyFinder) (string, bool) {
	if len(path) < keys.minLen || (!keys.holds(path) && strings.IndexByte(path, '%') < 0) {
		return path, false
	}
	segments := strings.Split(path, sep)
	found := false
	// Key-like text may run across segments, where none holds it alone: a
	// '/' typed into a key ("cxr_AbCd/EfGh…"). Every segment from the first
	// that holds a tag goes then, but for words (routeWord): the route's
	// own "sales/confirm" would otherwise make an item id with a tag,
	// "cxr_coin-17", read as most of a key, and hide every sale path of it.
	// Read before any segment is "[key]": after, the rest of a key that
	// runs on from a segment holding most of it reads as no key, and was
	// kept ("/[key]/<23 characters of the secret>").
	if keys.acrossSegments && holdsDecoded(maskWords(segments, sep, keys.tagged), keys.holds) {
		tagged := false
		for i, segment := range segments {
			tagged = tagged || holdsDecoded(segment, keys.tagged)
			if tagged && segment != "" && !routeWord(segment) {
				segments[i], found = "[key]", true
			}
		}
	}
	for i, segment := range segments {
		if segmentHoldsKey(segment, keys) {
			segments[i], found = "[key]", true
		}
	}
	if !found {
		return path, false
	}
	return strings.Join(segments, sep), true
}

// routeWord reports whether a path segment is a word of lower-case letters,
// as every literal segment of the API's routes is ("export", "sales",
// "confirm"). A key's random part is base62: eight of its characters all
// lower-case letters has odds of about one in a thousand.
func routeWord(segment string) bool {
	for i := range len(segment) {
		if segment[i] < 'a' || segment[i] > 'z' {
			return false
		}
	}
	return segment != ""
}

// maskWords joins the segments with each routeWord's letters as dots, for
// the search of key-like text that runs across segments: a word counts for
// none of it, but keeps its place, so the path never reads denser than as
// sent (redactParts' first test, on the path as sent, stays a bound). A
// word that tagged reads a tag in is kept: a host's label "cxr" is a tag
// with nothing for its '_', and masked, "cxr.<a key's body>" read as none.
func maskWords(segments []string, sep string, tagged func(string) bool) string {
	var b strings.Builder
	for i, segment := range segments {
		if i > 0 {
			b.WriteString(sep)
		}
		if routeWord(segment) && !tagged(segment) {
			segment = strings.Repeat(".", len(segment))
		}
		b.WriteString(segment)
	}
	return b.String()
}

// ContainsKey reports whether s holds a well-formed key anywhere in it, or
// a key's secret without its tag (ContainsUntaggedKey), for free text a
// client sends (a path, a query) that the gateway refuses to forward when
// it does.
func ContainsKey[T string | []byte](s T) bool {
	for i := 0; i+Len <= len(s); i++ {
		if s[i] == TagRead[0] && s[i+1] == TagRead[1] && WellFormed(s[i:i+Len]) { // every tag begins with "cx"
			return true
		}
	}
	return ContainsUntaggedKey(s)
}

// untaggedLen is the length of a key without its tag: its body and its
// checksum, the whole of its secret (the tag is one of three words).
const untaggedLen = bodyLen + checksumLen

// ContainsUntaggedKey reports whether s holds a key with its tag left out:
// untaggedLen characters of the alphabet whose last checksumLen are the
// checksum of one of the tags and the body before them. The tag tells
// only the scopes, so such text is the whole secret, sent by a client that
// took "cxr_" for a type's prefix or cut the key at its '_'.
//
// Only the two ends of each run of the alphabet's characters are read: a
// key pasted alone (the run itself), or with something run into it before
// or after ("cxr" with its '_' dropped, "<key>x"). A run of random letters
// and digits passes for a key under one of the three tags once in 62^6/3
// (1.9e10) tries; every window of a client's long ids read, a catalog of a
// million 128-character ids would hold one the gateway refused, for good,
// once in 240 catalogs (a run's ends: once in 9,400).
func ContainsUntaggedKey[T string | []byte](s T) bool {
	for start := 0; start+untaggedLen <= len(s); {
		end := start
		for end < len(s) && inAlphabet[s[end]] {
			end++
		}
		if end-start >= untaggedLen && isUntaggedKey(s[start:start+untaggedLen]) ||
			end-start > untaggedLen && isUntaggedKey(s[end-untaggedLen:end]) { // a run of one key's length has one end to read
			return true
		}
		start = end + 1
	}
	return false
}

// RestoreTag returns the key that s is without its tag, when s is a key's
// body and checksum under one of the tags: the checksum tells which.
func RestoreTag(s string) (key string, ok bool) {
	if len(s) != untaggedLen {
		return "", false
	}
	for _, tag := range []string{TagRead, TagWrite, TagAll} {
		if WellFormed(tag + s) {
			return tag + s, true
		}
	}
	return "", false
}

// isUntaggedKey reports whether run, untaggedLen characters of the
// alphabet, is a key's body and checksum under one of the tags. The body's
// CRC-32 register is read once: that of a tag and the body is the tag's
// (tagRegisters) XOR the body's read from zero, as CRC-32 is linear.
func isUntaggedKey[T string | []byte](run T) bool {
	if alphabetIndex[run[bodyLen]] > maxChecksumLead { // a checksum is 32 bits
		return false
	}
	sum := decodeChecksum(run[bodyLen:])
	body := crcUpdate(0, run[:bodyLen])
	for _, tag := range tagRegisters {
		if uint64(^(tag ^ body)) == sum {
			return true
		}
	}
	return false
}

var (
	// tagRegisters are the CRC-32 registers of each tag followed by a body
	// of zero bytes: what a tag adds to its key's register.
	tagRegisters = [...]uint32{
		pastBody(crcUpdate(^uint32(0), TagRead)), pastBody(crcUpdate(^uint32(0), TagWrite)), pastBody(crcUpdate(^uint32(0), TagAll)),
	}
	// alphabetIndex is each alphabet byte's value as a base62 digit.
	alphabetIndex = func() (index [256]byte) {
		for i := range len(alphabet) {
			index[alphabet[i]] = byte(i)
		}
		return index
	}()
)

// maxChecksumLead is the largest first digit of a checksum in base62:
// 4 × 62^5 ≤ 2^32 - 1 < 5 × 62^5.
const maxChecksumLead = 4

// pastBody is register c after a body's length of zero bytes.
func pastBody(c uint32) uint32 {
	for range bodyLen {
		c = crc32.IEEETable[byte(c)] ^ c>>8
	}
	return c
}

// decodeChecksum reads checksumLen alphabet characters as base62; a value
// over 32 bits matches no checksum.
func decodeChecksum[T string | []byte](sum T) uint64 {
	var n uint64
	for i := range checksumLen {
		n = n*62 + uint64(alphabetIndex[sum[i]])
	}
	return n
}

// ContainsKeySecret reports whether s holds a key's tag as a copy of a key
// spells it (isCopiedKeyTag) followed by a whole key's body: bodyLen
// characters of its alphabet within keySecretWindow bytes. That is a key,
// or one whose checksum is cut off or mistyped, with a typo in its body or
// a character slipped into it. Such text fails WellFormed, but its secret
// is whole: the checksum is recomputed, and a typo found by it. A key
// without its tag is its whole secret too (ContainsUntaggedKey). What is
// stored as a client sent it must hold none (the sales-writer refuses it),
// nor what is sent on (shop-schema's ws_key).
func ContainsKeySecret[T string | []byte](s T) bool {
	return holdsTaggedRun(s, copiedTags, bodyLen, keySecretWindow) || ContainsUntaggedKey(s)
}

// keySecretWindow is how many bytes after a tag ContainsKeySecret counts a
// body's characters in: a few more than a body, so that a dash or a space
// typed into it does not hide the rest.
const keySecretWindow = bodyLen + 4

// minKeyLikeRun is how many characters of the keys' alphabet after a tag
// make text look like a key to ContainsKeyLike: 16 of them are 95 bits,
// most of a key's secret (it has 256), far more than any guess. They are
// counted within keyLikeWindow bytes, so a typo or two between them (a
// dash, a space) does not hide the rest.
const (
	minKeyLikeRun = 16
	keyLikeWindow = 24
)

// ContainsKeyLike reports whether s holds a key's tag, in any case and
// with '_', '-' or ' ' after it, followed by minKeyLikeRun characters of
// its alphabet within keyLikeWindow bytes: a key, or one mistyped (its
// checksum fails) or cut short. Such text is no key the gateway refuses,
// but most of a secret all the same, to be kept out of spans and logs
// (a client's User-Agent, an id it chose). Only for what is recorded: an
// item id that merely looks like a key is still served. A key stripped of
// its tag is found whole only (ContainsUntaggedKey, by its checksum): cut
// short or mistyped, its letters and digits cannot be told from a
// client's random id or Idempotency-Key, which the logs must keep.
func ContainsKeyLike[T string | []byte](s T) bool {
	return holdsTaggedRun(s, typedTags, minKeyLikeRun, keyLikeWindow) || ContainsUntaggedKey(s)
}

// tagSpelling is which spellings of a tag holdsTaggedRun reads as one.
type tagSpelling bool

const (
	copiedTags tagSpelling = true  // isCopiedKeyTag
	typedTags  tagSpelling = false // isKeyTag
)

// holdsTaggedRun reports whether s holds a key's tag, spelt as tags reads
// one, followed by run characters of the keys' alphabet within window
// bytes. (tags is no func: called through a func value, the tag test
// made BenchmarkContainsKeySecret about twice as slow.)
func holdsTaggedRun[T string | []byte](s T, tags tagSpelling, run, window int) bool {
	for i := 0; i+tagLen+run <= len(s); i++ {
		a, b, c, d := s[i], s[i+1], s[i+2], s[i+3]
		if tags == copiedTags && !isCopiedKeyTag(a, b, c, d) || tags == typedTags && !isKeyTag(a, b, c, d) {
			continue
		}
		alphabetic := 0
		for j := i + tagLen; j < len(s) && j < i+tagLen+window; j++ {
			if inAlphabet[s[j]] {
				if alphabetic++; alphabetic >= run {
					return true
				}
			}
		}
	}
	return false
}

// isKeyTag reports whether a, b, c, d spell a tag ("cxr_", "cxw_", "cxa_")
// in any case, with '-' or ' ' for its '_'.
func isKeyTag(a, b, c, d byte) bool {
	const lower = 0x20
	a, b, c = a|lower, b|lower, c|lower
	return a == 'c' && b == 'x' && (c == 'r' || c == 'w' || c == 'a') && (d == '_' || d == '-' || d == ' ')
}

// isCopiedKeyTag reports whether a, b, c, d spell a tag as a copy of a key
// holds it: as Generate writes it, or upper-cased (a copy upper-cased is
// recovered too: its checksum tells the case of its letters back). A tag
// in mixed case, or with '-' or ' ' for its '_', is typed, not copied.
// ContainsKeySecret, by which the sale routes refuse a client's value,
// read such tags too, and so refused every order numbered "CXR-" and 64
// hex digits, and one random base64url Idempotency-Key of 128 characters
// in 4,800 (one in 38,000 now; of 64 characters, one in 23,500, now one
// in 121,000).
func isCopiedKeyTag(a, b, c, d byte) bool {
	switch {
	case d != '_':
		return false
	case a == 'c' && b == 'x':
		return c == 'r' || c == 'w' || c == 'a'
	case a == 'C' && b == 'X':
		return c == 'R' || c == 'W' || c == 'A'
	}
	return false
}

// holdsKeyTag reports whether s holds a key's tag as isKeyTag reads one.
func holdsKeyTag(s string) bool {
	for i := 0; i+tagLen <= len(s); i++ {
		if isKeyTag(s[i], s[i+1], s[i+2], s[i+3]) {
			return true
		}
	}
	return false
}

// holdsDecoded reports whether holds finds something in s as sent or
// decoded, up to maxUnescapes times.
func holdsDecoded(s string, holds func(string) bool) bool {
	for range maxUnescapes + 1 {
		if holds(s) {
			return true
		}
		decoded := percent.DecodeLeniently(s)
		if decoded == s {
			return false
		}
		s = decoded
	}
	return false
}

// segmentHoldsKey reports whether a path segment holds a key, as sent or
// decoded.
func segmentHoldsKey(segment string, keys keyFinder) bool {
	if keys.holds(segment) {
		return true
	}
	if len(segment) <= keys.minLen || strings.IndexByte(segment, '%') < 0 {
		return false // an escape makes a segment longer than the key it spells
	}
	// Decoded again while it changes: "%2563" is "%63" is "c", and a
	// service that decodes twice would see the key. A segment still
	// changing after maxUnescapes rounds is taken for one that hides a key:
	// no client needs that many, and the rounds stay bounded.
	for range maxUnescapes {
		decoded := percent.DecodeLeniently(segment)
		if decoded == segment {
			return false
		}
		if keys.holds(decoded) {
			return true
		}
		segment = decoded
	}
	return true
}

const maxUnescapes = 4

// HashOf returns the stored form of secret.
func HashOf(secret string) Hash {
	return sha256.Sum256([]byte(secret))
}

// checksum is the CRC-32 of a key's tag and body in base62, left-padded to
// checksumLen. It neither allocates nor uses big.Int: WellFormed runs on
// every path segment of a key's length that a client sends (RedactPath),
// before any rate limit, so it must cost next to nothing.
func checksum[T string | []byte](s T) [checksumLen]byte {
	return encodeChecksum(^crcUpdate(^uint32(0), s))
}

// crcUpdate is crc32.ChecksumIEEE's register c after reading s, read in
// place: a []byte made of a string would escape to the heap.
func crcUpdate[T string | []byte](c uint32, s T) uint32 {
	for i := 0; i < len(s); i++ {
		c = crc32.IEEETable[byte(c)^s[i]] ^ c>>8
	}
	return c
}

// encodeChecksum writes a CRC-32 in base62, left-padded to checksumLen.
func encodeChecksum(c uint32) [checksumLen]byte {
	var out [checksumLen]byte
	for i := checksumLen - 1; i >= 0; i-- {
		out[i] = alphabet[c%62]
		c /= 62
	}
	return out
}

// base62 encodes b as a big-endian number, left-padded with zeros to width.
func base62(b []byte, width int) string {
	n := new(big.Int).SetBytes(b)
	base, mod := big.NewInt(62), new(big.Int)
	out := make([]byte, width)
	for i := width - 1; i >= 0; i-- {
		n.DivMod(n, base, mod)
		out[i] = alphabet[mod.Int64()]
	}
	return string(out)
}
