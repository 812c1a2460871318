package api

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coinexport/export/services/export-reader/internal/export"
)

// parseList reads a raw query as net/url reads it, and takes it only when
// every parameter is one of the route's, given once, with a valid value:
// its answer is the reference's (a query split as url.ParseQuery splits
// it, each parameter checked on its own), and a refusal names one of the
// parameters at fault. The seeds are TestListParameters' queries.
func FuzzParseList(f *testing.F) {
	for _, q := range []string{
		"", "lang=ENG&", "lang=ENG&lang2=x", "LIMIT=1", "updatedAfter=2000-01-01T00:00:00Z", "foo", "%zz=1",
		"cxr_" + strings.Repeat("A", 40) + "=1", "lang=RUS", "lang=UKR", "lang=eng", "lang=DEU", "lang=",
		"lang=ENG&lang=RUS", "limit=1", "limit=100", "limit=01", "limit=0001", "limit=0000100", "limit=0000",
		"limit=0101", "limit=0", "limit=101", "limit=-1", "limit=%2B5", "limit=1.5", "limit=abc",
		"limit=99999999999999999999", "limit=%zz", "status=active", "status=inactive", "status=sold", "status=Active",
		"updated_after=2000-01-01T00:00:00Z", "updated_after=2000-01-01T02:00:00.5%2B02:00",
		"updated_after=2000-01-01T02:00:00+02:00", "updated_after=2000-01-01t00:00:00z",
		"updated_after=2000-01-01T00:00:00%2B24:00", "updated_after=2000-01-01T00:00:00,5Z",
		"updated_after=2000-01-01T00:00:00.Z", "updated_after=2026-01-01", "updated_after=", "cursor=", "cursor=abc",
		"cursor=%FF%FE", "status=active&lang=UKR&limit=3&updated_after=2000-01-01T02%3A00%3A00%2B02%3A00&cursor=AQAG",
		"l%61ng=RUS&lang=ENG", "cursor=a;b", "lang;x=ENG", "limit=5&&&status=active", "=", "&", "lang",
	} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := parseList(raw)
		want, faults := referenceList(raw)
		if err != nil {
			var pe *paramError
			if !errors.As(err, &pe) {
				t.Fatalf("parseList(%q) error = %v, want a paramError", raw, err)
			}
			if len(faults) == 0 {
				t.Fatalf("parseList(%q) error = %v, want %+v", raw, err, want)
			}
			if !faults[pe.Code] {
				t.Fatalf("parseList(%q) error = %v, want one of %v", raw, err, faults)
			}
			return
		}
		if len(faults) > 0 {
			t.Fatalf("parseList(%q) = %+v, want one of %v", raw, got, faults)
		}
		if got.Lang != want.Lang || got.Limit != want.Limit || got.Status != want.Status || got.Cursor != want.Cursor ||
			(got.UpdatedAfter == nil) != (want.UpdatedAfter == nil) ||
			got.UpdatedAfter != nil && !got.UpdatedAfter.Equal(*want.UpdatedAfter) {
			t.Fatalf("parseList(%q) = %+v, want %+v", raw, got, want)
		}
	})
}

// referenceList reads a raw query as url.ParseQuery does, but for a ';',
// which ParseQuery refuses anywhere in a pair and the reader only in a
// name (no parameter has one), and checks each parameter on its own. It
// returns the query, or the error codes a refusal may carry: every
// fault's (a query with several may be refused for any).
func referenceList(raw string) (export.Query, map[string]bool) {
	faults := map[string]bool{}
	q := export.Query{Lang: "ENG", Limit: defaultLimit}
	values := url.Values{}
	for pair := range strings.SplitSeq(raw, "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(rawKey)
		code, known := listParams.code(key)
		if err != nil || !known {
			faults["invalid_parameter"] = true
			continue
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			faults[code] = true
			continue
		}
		values.Add(key, value)
	}
	for key, vs := range values {
		code, _ := listParams.code(key)
		if len(vs) > 1 {
			faults[code] = true
			continue
		}
		v := vs[0]
		switch key {
		case "lang":
			q.Lang = v
			faults[code] = faults[code] || !slices.Contains([]string{"ENG", "RUS", "UKR"}, v)
		case "limit":
			// Digits only, however many leading zeros, 1 to 100.
			n, err := strconv.ParseUint(strings.TrimLeft(v, "0"), 10, 16)
			q.Limit = int(n)
			faults[code] = faults[code] || err != nil || n < 1 || n > maxLimit
		case "status":
			q.Status = v
			faults[code] = faults[code] || v != "active" && v != "inactive"
		case "updated_after":
			t, ok := referenceUpdatedAfter(v)
			q.UpdatedAfter = &t
			faults[code] = faults[code] || !ok
		case "cursor":
			q.Cursor = v
			faults[code] = faults[code] || v == ""
		}
	}
	for code, fault := range faults {
		if !fault {
			delete(faults, code)
		}
	}
	return q, faults
}

// A value refused for holding the next parameter after a ';' (a client
// that separated them so) says that '&' separates them, under the value's
// own code; a value refused for anything else, or a ';' in a value taken
// as it is (a cursor, checked later), gets no such word.
func TestASemicolonBetweenParametersIsNamed(t *testing.T) {
	const hint = "separate query parameters with &, not ;"
	for _, tt := range []struct {
		query, code string
		hinted      bool
	}{
		{"limit=1;lang=RUS", "invalid_limit", true},
		{"lang=RUS;limit=1", "invalid_lang", true},
		{"status=active;updated_after=2000-01-01T00:00:00Z", "invalid_status", true},
		{"limit=1;x=2", "invalid_limit", false},
		{"limit=abc", "invalid_limit", false},
		{"cursor=a;lang=RUS", "", false},
	} {
		_, err := parseList(tt.query)
		var pe *paramError
		if tt.code == "" {
			if err != nil {
				t.Errorf("parseList(%q) = %v, want no error", tt.query, err)
			}
			continue
		}
		if !errors.As(err, &pe) || pe.Code != tt.code || strings.Contains(pe.Message, hint) != tt.hinted {
			t.Errorf("parseList(%q) = %v, want %s, the & hint %v", tt.query, err, tt.code, tt.hinted)
		}
	}
	if _, err := parseItem("lang=RUS;lang=UKR"); err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("parseItem(lang=RUS;lang=UKR) = %v, want invalid_lang with the & hint", err)
	}
}
