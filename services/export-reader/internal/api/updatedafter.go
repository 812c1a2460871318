package api

import (
	"slices"
	"strings"
	"time"
)

// updatedAfterExample ends every refusal of updated_after, so the client sees
// the accepted form.
const updatedAfterExample = "e.g. 2026-10-15T08:30:00.123456Z or 2026-10-15T10:30:00+02:00"

var (
	errUpdatedAfter = &paramError{"invalid_updated_after",
		"updated_after must be an RFC 3339 date-time with a time offset (±hhmm, ±hh, a ',' before the fraction and a time to the minute, hh:mm, are read too), " + updatedAfterExample}
	errUpdatedAfterDate = &paramError{"invalid_updated_after",
		"updated_after must be a date-time, not a date alone (whose start depends on the zone), " + updatedAfterExample}
	errUpdatedAfterNoOffset = &paramError{"invalid_updated_after",
		"updated_after needs a time offset, Z or ±hh:mm (a time without one is ambiguous), " + updatedAfterExample}
	errUpdatedAfterOffset = &paramError{"invalid_updated_after",
		"updated_after has an invalid time offset: Z, ±hh:mm, ±hhmm or ±hh from -23:59 to +23:59, " + updatedAfterExample}
	errUpdatedAfterTrailing = &paramError{"invalid_updated_after",
		"updated_after goes on after its time offset: only a time zone in brackets, as [Europe/Paris] (RFC 9557), may follow it, not a space or any other character, " + updatedAfterExample}
	errUpdatedAfterSuffix = &paramError{"invalid_updated_after",
		"updated_after may end in a time zone after its offset, as [Europe/Paris] (RFC 9557), and in nothing else; a critical one, [!…], is not read, " + updatedAfterExample}
)

// parseUpdatedAfter reads an RFC 3339 date-time (section 5.6): the T and Z
// in either case, any number of fractional digits, an offset Z or ±hh:mm
// with hh 00–23 and mm 00–59. Spec 4.3 says ISO 8601, so the variants of
// it that client libraries write are read too: a fraction after a comma,
// and an offset ±hhmm or ±hh (PHP's DATE_ISO8601 and Java's "Z" pattern
// write +0200, mixing ISO's basic and extended forms), a time to the
// minute (withSeconds) and a time zone after the offset (withoutSuffix). A date alone or a time without an offset is
// refused: taking it as UTC would silently skip items for a client in
// another zone.
//
// The fraction is cut to microseconds, PostgreSQL's precision, never rounded
// up: for a stored stamp s, s > t exactly when s > t cut to microseconds, so
// "strictly after" stays exact. A leap second (second 60) is read as the last
// microsecond before the next minute, the same direction: nothing stamped
// after it is skipped (PostgreSQL never stamps a second 60).
//
// A '+' of the offset sent unencoded arrives as a space; that one space is
// read as '+', since the value cannot mean anything else.
func parseUpdatedAfter(v string) (time.Time, error) {
	const dateTime = "dddd-dd-ddTdd:dd:dd"
	v, err := withoutSuffix(v)
	if err != nil {
		return time.Time{}, err
	}
	v = withSeconds(v)
	if len(v) < len(dateTime) {
		if hasShape(v, "dddd-dd-dd") {
			return time.Time{}, errUpdatedAfterDate
		}
		return time.Time{}, errUpdatedAfter
	}
	head := []byte(v[:len(dateTime)])
	if head[10] == 't' {
		head[10] = 'T'
	}
	if !hasShape(string(head), dateTime) {
		return time.Time{}, errUpdatedAfter
	}
	leap := string(head[17:]) == "60"
	if leap {
		head[17], head[18] = '5', '9'
	}
	rest := v[len(dateTime):]
	frac := ""
	if strings.HasPrefix(rest, ".") || strings.HasPrefix(rest, ",") {
		n := 1
		for n < len(rest) && '0' <= rest[n] && rest[n] <= '9' {
			n++
		}
		if n == 1 {
			return time.Time{}, errUpdatedAfter
		}
		frac, rest = "."+rest[1:min(n, len(".000000"))], rest[n:]
	}
	if leap {
		frac = ".999999"
	}
	offset, err := parseOffset(rest)
	if err != nil {
		return time.Time{}, err
	}
	// Every field now has the shape of RFC3339Nano, so the parse only
	// checks the ranges (month, day of the month, hour, minute, second).
	t, err := time.Parse(time.RFC3339Nano, string(head)+frac+offset)
	if err != nil {
		return time.Time{}, errUpdatedAfter
	}
	return t.UTC(), nil
}

// withSeconds gives a time written to the minute, hh:mm then its offset,
// its seconds (:00). ISO 8601 lets them be left out, and Java's
// OffsetDateTime.toString() and ZonedDateTime.toString() leave them out
// for a whole minute (2026-11-29T19:51Z): a Java client whose checkpoint
// fell on one was refused 400 on every run, as a failed run keeps its
// checkpoint. Only before an offset: a fraction after hh:mm would be one
// of a minute, which no library writes, and stays refused.
func withSeconds(v string) string {
	const toTheMinute = "dddd-dd-ddTdd:dd"
	n := len(toTheMinute)
	if len(v) <= n || !strings.ContainsRune("Zz+- ", rune(v[n])) {
		return v
	}
	head := []byte(v[:n])
	if head[10] == 't' {
		head[10] = 'T'
	}
	if !hasShape(string(head), toTheMinute) {
		return v
	}
	return v[:n] + ":00" + v[n:]
}

// withoutSuffix drops the RFC 9557 suffix after the offset, one or more
// bracketed tags: Java's ZonedDateTime.toString() writes its zone's
// region there whenever the zone is one, the system's included
// (2026-11-29T19:51+01:00[Europe/Paris], …Z[Etc/UTC] from
// ZonedDateTime.now() on a UTC machine), and was refused 400 on every
// run. The offset before it fixes the instant, so an elective tag changes
// nothing (RFC 9557, 3.4: a reader may ignore it); a critical one, [!…],
// asks to be acted on, which this reader cannot, and is refused. A tag
// holds what a zone name, a numeric offset or a key=value tag may: letters,
// digits and "/_-+.=:" (RFC 9557's zone may be an offset, [+01:00], as
// JavaScript's Temporal writes for a zone that is one, and Java's
// ZonedDateTime writes a GMT-prefixed one as [GMT+01:00]).
func withoutSuffix(v string) (string, error) {
	for strings.HasSuffix(v, "]") {
		open := strings.LastIndexByte(v, '[')
		if open < 0 || !isSuffixTag(v[open+1:len(v)-1]) {
			return "", errUpdatedAfterSuffix
		}
		v = v[:open]
	}
	return v, nil
}

// isSuffixTag reports whether tag, a bracketed tag's contents, is one
// withoutSuffix drops: not empty, not critical, of a zone name's, a
// numeric offset's or a key=value tag's characters.
func isSuffixTag(tag string) bool {
	if tag == "" || len(tag) > 255 {
		return false
	}
	for _, c := range []byte(tag) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("/_-+.=:", c) >= 0) {
			return false
		}
	}
	return true
}

// parseOffset checks s, a time offset (Z, ±hh:mm, ±hhmm or ±hh) and
// nothing after it, and returns the offset as time.Parse takes it (Z or
// ±hh:mm). A valid offset followed by anything (a trailing space a copied
// value brought along) is refused as that, not as an invalid offset, which
// would send the client to correct an offset that is right.
func parseOffset(s string) (string, error) {
	if offset, after := splitOffset(s); after != "" {
		if _, err := offsetOf(offset); err == nil {
			return "", errUpdatedAfterTrailing
		}
	}
	// An offset itself wrong is judged whole, not cut where its digits
	// end: an unencoded '+' before "0A:00" would leave " 0", read as no
	// offset at all ("must be an RFC 3339 date-time"), not a wrong one.
	return offsetOf(s)
}

// splitOffset splits s where its offset ends: after a Z, or after the
// digits and colons that follow a sign (or the space an unencoded '+'
// arrives as). What starts otherwise is all offset, for offsetOf to refuse.
func splitOffset(s string) (offset, after string) {
	switch {
	case s == "":
		return "", ""
	case s[0] == 'Z' || s[0] == 'z':
		return s[:1], s[1:]
	case strings.IndexByte("+- ", s[0]) < 0:
		return s, ""
	}
	n := 1
	for n < len(s) && (s[n] == ':' || '0' <= s[n] && s[n] <= '9') {
		n++
	}
	return s[:n], s[n:]
}

// offsetOf checks a time offset alone and returns it as time.Parse takes
// it.
func offsetOf(s string) (string, error) {
	switch {
	case s == "":
		return "", errUpdatedAfterNoOffset
	case s == "Z" || s == "z":
		return "Z", nil
	case s[0] == ' ' && slices.Contains([]int{len("+hh:mm"), len("+hhmm"), len("+hh")}, len(s)):
		s = "+" + s[1:] // an unencoded '+'
	}
	if s[0] != '+' && s[0] != '-' {
		return "", errUpdatedAfter
	}
	sign, hhmm := s[:1], s[1:]
	switch {
	case hasShape(hhmm, "dd:dd"):
	case hasShape(hhmm, "dddd"):
		hhmm = hhmm[:2] + ":" + hhmm[2:]
	case hasShape(hhmm, "dd"):
		hhmm += ":00"
	default:
		return "", errUpdatedAfterOffset
	}
	if hhmm[:2] > "23" || hhmm[3:] > "59" {
		return "", errUpdatedAfterOffset
	}
	return sign + hhmm, nil
}

// hasShape reports whether s matches shape, where 'd' stands for an ASCII
// digit and any other byte for itself.
func hasShape(s, shape string) bool {
	if len(s) != len(shape) {
		return false
	}
	for i := range len(s) {
		if shape[i] == 'd' && (s[i] < '0' || s[i] > '9') || shape[i] != 'd' && s[i] != shape[i] {
			return false
		}
	}
	return true
}
