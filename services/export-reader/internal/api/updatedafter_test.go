package api

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// updatedAfterCases are TestParseUpdatedAfter's table and
// FuzzParseUpdatedAfter's seeds.
var updatedAfterCases = []struct {
	in, want string // want: the instant in UTC, or "" for a 400
	message  string // a substring of the 400's message
}{
	{"2026-11-21T17:23:37Z", "2026-11-21T17:23:37Z", ""},
	{"2026-11-21t17:23:37z", "2026-11-21T17:23:37Z", ""},
	{"2026-11-21T17:23:37z", "2026-11-21T17:23:37Z", ""},
	{"2026-11-21t19:23:37+02:00", "2026-11-21T17:23:37Z", ""},
	{"2026-11-21T17:23:37.5Z", "2026-11-21T17:23:37.5Z", ""},
	{"2026-11-21T17:23:37.123456Z", "2026-11-21T17:23:37.123456Z", ""},
	// Cut to microseconds, never rounded up: an item stamped .000002
	// is after .0000019999.
	{"2026-11-21T17:23:37.0000019999Z", "2026-11-21T17:23:37.000001Z", ""},
	{"2026-11-21T17:23:37.0000014999Z", "2026-11-21T17:23:37.000001Z", ""},
	{"2026-11-21T17:23:37." + strings.Repeat("9", 200) + "Z", "2026-11-21T17:23:37.999999Z", ""},
	{"2026-11-21T17:23:37." + strings.Repeat("0", 500) + "1Z", "2026-11-21T17:23:37Z", ""},
	// Before the epoch too, the cut goes toward the past.
	{"1969-12-31T23:59:59.9999999Z", "1969-12-31T23:59:59.999999Z", ""},
	{"0000-01-01T00:00:00.0000009Z", "0000-01-01T00:00:00Z", ""},
	{"9999-12-31T23:59:59.999999999+23:59", "9999-12-31T00:00:59.999999Z", ""},
	{"2026-11-21T17:23:37+23:59", "2026-11-20T17:24:37Z", ""},
	{"2026-11-21T17:23:37-23:59", "2026-11-22T17:22:37Z", ""},
	{"2026-11-21T17:23:37-00:00", "2026-11-21T17:23:37Z", ""},
	{"2026-11-21T17:23:37 02:00", "2026-11-21T15:23:37Z", ""}, // unencoded "+" arrives as a space
	{"2024-02-29T00:00:00Z", "2024-02-29T00:00:00Z", ""},
	// Variants client libraries write (spec 4.3 says ISO 8601): ±hhmm, ±hh, a comma.
	{"2026-11-21T17:23:37+0500", "2026-11-21T12:23:37Z", ""},
	{"2026-11-21T17:23:37-0130", "2026-11-21T18:53:37Z", ""},
	{"2026-11-21T17:23:37 0200", "2026-11-21T15:23:37Z", ""},
	{"2026-11-21T17:23:37+05", "2026-11-21T12:23:37Z", ""},
	{"2026-11-21T17:23:37 05", "2026-11-21T12:23:37Z", ""},
	{"2026-11-21T17:23:37,5Z", "2026-11-21T17:23:37.5Z", ""},
	{"2026-11-21T17:23:37,1234567+0000", "2026-11-21T17:23:37.123456Z", ""},
	// A time to the minute (ISO 8601 lets the seconds be left out; Java's
	// OffsetDateTime.toString() leaves them out for a whole minute).
	{"2026-11-21T17:23Z", "2026-11-21T17:23:00Z", ""},
	{"2026-11-21t17:23z", "2026-11-21T17:23:00Z", ""},
	{"2026-11-21T19:23+02:00", "2026-11-21T17:23:00Z", ""},
	{"2026-11-21T12:23-0500", "2026-11-21T17:23:00Z", ""},
	{"2026-11-21T19:23 02:00", "2026-11-21T17:23:00Z", ""},
	// Java's ZonedDateTime.toString(): its zone's region after the offset
	// (RFC 9557), which the offset makes redundant.
	{"2026-11-29T19:51+01:00[Europe/Paris]", "2026-11-29T18:51:00Z", ""},
	{"2026-11-29T19:51Z[Etc/UTC]", "2026-11-29T19:51:00Z", ""},
	{"2026-11-29T19:51:30.5+01:00[Europe/Paris]", "2026-11-29T18:51:30.5Z", ""},
	{"2026-11-29T19:51:30-03:00[America/Argentina/Buenos_Aires][u-ca=iso8601]", "2026-11-29T22:51:30Z", ""},
	{"2026-11-29T19:51:30+05:00[Etc/GMT-5]", "2026-11-29T14:51:30Z", ""},
	{"2026-11-29T19:51:30+01:00[+01:00]", "2026-11-29T18:51:30Z", ""},        // RFC 9557's numeric zone, as Temporal writes it
	{"2026-11-29T19:51:30.5+01:00[GMT+01:00]", "2026-11-29T18:51:30.5Z", ""}, // Java's ZoneId.of("GMT+01:00")
	// A leap second is read as the last microsecond of the second before it.
	{"2016-12-31T23:59:60Z", "2016-12-31T23:59:59.999999Z", ""},
	{"2016-12-31T23:59:60.5Z", "2016-12-31T23:59:59.999999Z", ""},
	{"2017-01-01T01:59:60.5+02:00", "2016-12-31T23:59:59.999999Z", ""},

	{"2026-11-21T17:23:37+24:00", "", "invalid time offset"},
	{"2026-11-21T17:23:37-24:00", "", "invalid time offset"},
	{"2026-11-21T17:23:37+05:60", "", "invalid time offset"},
	{"2026-11-21T17:23:37+5:00", "", "invalid time offset"},
	{"2026-11-21T17:23:37+050", "", "invalid time offset"},
	{"2026-11-21T17:23:37+2400", "", "invalid time offset"},
	{"2026-11-21T17:23:37+0560", "", "invalid time offset"},
	{"2026-11-21T17:23:37+24", "", "invalid time offset"},
	{"2026-11-21T17:23:37+05:00:00", "", "invalid time offset"},
	{"2026-11-21T17:23:37-0a:00", "", "invalid time offset"},
	// A valid offset with anything after it but an RFC 9557 tag: a space
	// (a copied value's), a character more. It read "invalid time offset".
	{"2026-11-21T17:23:37Zz", "", "goes on after its time offset"},
	{"2026-11-21T17:23:37Z ", "", "goes on after its time offset"},
	{"2026-11-21T17:23:37z\t", "", "goes on after its time offset"},
	{"2026-11-21T17:23Z ", "", "goes on after its time offset"},
	{"2026-11-21T17:23:37+02:00 ", "", "goes on after its time offset"},
	{"2026-11-21T17:23:37 02:00 ", "", "goes on after its time offset"}, // an unencoded '+', then a space
	{"2026-11-21T17:23:37+0200x", "", "goes on after its time offset"},
	{"2026-11-21T17:23:37-05.", "", "goes on after its time offset"},
	{"2026-11-29T19:51+01:00[Europe/Paris] ", "", "goes on after its time offset"},
	// An offset itself wrong, with something after it, is still that.
	{"2026-11-21T17:23:37+24:00 ", "", "invalid time offset"},
	{"2026-11-21T17:23:37+5:00x", "", "invalid time offset"},
	{"2026-11-21T17:23:37 0A:00", "", "invalid time offset"}, // an unencoded '+'
	{"2026-11-21T17:23:37UTC", "", "must be an RFC 3339"},
	{"2026-11-21", "", "date alone"},
	{"2026-11-21T17:23:37", "", "without one is ambiguous"},
	{"2026-11-21T17:23:37.123", "", "without one is ambiguous"},
	{"2026-11-21T17:23", "", "must be an RFC 3339"},
	{"2026-11-21T17:23.5Z", "", "must be an RFC 3339"}, // a fraction of a minute
	{"2026-11-21T17Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:60Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:23:Z", "", "must be an RFC 3339"},
	// A suffix after the offset (RFC 9557) other than elective tags of a
	// zone name's or key=value's characters.
	{"2026-11-29T19:51+01:00[!Europe/Paris]", "", "[!…], is not read"},
	{"2026-11-29T19:51+01:00[]", "", "RFC 9557"},
	{"2026-11-29T19:51+01:00[Europe Paris]", "", "RFC 9557"},
	{"2026-11-29T19:51+01:00Europe/Paris]", "", "RFC 9557"},
	{"2026-11-29T19:51+01:00[Europe/Paris", "", "goes on after its time offset"},
	{"2026-11-29T19:51+01:00[[Europe/Paris]]", "", "RFC 9557"},
	{"2026-11-29T19:51:00[Europe/Paris]", "", "without one is ambiguous"}, // a zone, no offset
	{"2026-11-29[Europe/Paris]", "", "date alone"},
	{"2026-11-21 17:23:37Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:23:37.Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:23:37,Z", "", "must be an RFC 3339"},
	{"2026-11-21T7:23:37Z", "", "must be an RFC 3339"},
	{"2026-11-21T24:00:00Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:60:00Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:23:61Z", "", "must be an RFC 3339"},
	{"2026-02-29T00:00:00Z", "", "must be an RFC 3339"},
	{"2026-13-01T00:00:00Z", "", "must be an RFC 3339"},
	{"2026-00-01T00:00:00Z", "", "must be an RFC 3339"},
	{"+2026-11-21T17:23:37Z", "", "must be an RFC 3339"},
	{"20261121T172337Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:23:37.12x4Z", "", "must be an RFC 3339"},
	{"2026-11-21T17:23:37\u00a0Z", "", "must be an RFC 3339"},
	{"1700000000", "", "must be an RFC 3339"},
	{"", "", "must be an RFC 3339"},
}

func TestParseUpdatedAfter(t *testing.T) {
	t.Parallel()
	for _, tt := range updatedAfterCases {
		got, err := parseUpdatedAfter(tt.in)
		if tt.want == "" {
			var pe *paramError
			if !errors.As(err, &pe) || pe.Code != "invalid_updated_after" || !strings.Contains(pe.Message, tt.message) ||
				!strings.Contains(pe.Message, "2026-10-15T08:30:00.123456Z") {
				t.Errorf("parseUpdatedAfter(%q) = %v, %v; want invalid_updated_after saying %q and showing the form", tt.in, got, err, tt.message)
			}
			continue
		}
		if err != nil || got.Format(time.RFC3339Nano) != tt.want || got.Location() != time.UTC {
			t.Errorf("parseUpdatedAfter(%q) = %s, %v; want %s", tt.in, got.Format(time.RFC3339Nano), err, tt.want)
		}
	}
}

// parseUpdatedAfter accepts exactly what its doc comment describes, and
// reads it as that instant: a reference made of a regular expression and
// the calendar's rules decides both, and never panics.
func FuzzParseUpdatedAfter(f *testing.F) {
	for _, tt := range updatedAfterCases {
		f.Add(tt.in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := parseUpdatedAfter(in)
		want, ok := referenceUpdatedAfter(in)
		if err != nil {
			var pe *paramError
			if !errors.As(err, &pe) || pe.Code != "invalid_updated_after" || !strings.Contains(pe.Message, updatedAfterExample) {
				t.Fatalf("parseUpdatedAfter(%q) error = %v, want invalid_updated_after showing the form", in, err)
			}
			if ok {
				t.Fatalf("parseUpdatedAfter(%q) error = %v, want %s", in, err, want.Format(time.RFC3339Nano))
			}
			return
		}
		if !ok {
			t.Fatalf("parseUpdatedAfter(%q) = %s, want an error", in, got.Format(time.RFC3339Nano))
		}
		if !got.Equal(want) || got.Location() != time.UTC || got.Nanosecond()%1000 != 0 {
			t.Fatalf("parseUpdatedAfter(%q) = %s, want %s in UTC", in, got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
		}
	})
}

var updatedAfterForm = regexp.MustCompile(`^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d)(?::(\d\d)(?:[.,](\d+))?)?(?:[Zz]|([+ -])(\d\d)(?::?(\d\d))?)(?:\[[A-Za-z0-9/_+.=:-]{1,255}\])*$`)

// referenceUpdatedAfter is parseUpdatedAfter written another way, for the
// fuzz target: the form by a regular expression (the seconds, and their
// fraction, optional; elective RFC 9557 tags after the offset), the ranges by hand, the fraction cut to microseconds, second 60 as the microsecond before the
// next minute, the offset subtracted.
func referenceUpdatedAfter(in string) (time.Time, bool) {
	m := updatedAfterForm.FindStringSubmatch(in)
	if m == nil {
		return time.Time{}, false
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	year, month, day, hour, minute, second := n(1), n(2), n(3), n(4), n(5), n(6)
	daysIn := time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
	if month < 1 || month > 12 || day < 1 || day > daysIn || hour > 23 || minute > 59 || second > 60 {
		return time.Time{}, false
	}
	micros, _ := strconv.Atoi((m[7] + "000000")[:6])
	if second == 60 {
		second, micros = 59, 999999
	}
	var offset time.Duration
	if m[8] != "" {
		hh, mm := n(9), 0
		if m[10] != "" {
			mm = n(10)
		}
		if hh > 23 || mm > 59 {
			return time.Time{}, false
		}
		offset = time.Duration(hh)*time.Hour + time.Duration(mm)*time.Minute
		if m[8] == "-" {
			offset = -offset
		}
	}
	return time.Date(year, time.Month(month), day, hour, minute, second, micros*1000, time.UTC).Add(-offset), true
}
