package api

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/coinexport/export/services/export-reader/internal/export"
)

// paramError is a 400 with its own error.code, naming the parameter.
type paramError struct {
	Code, Message string
}

func (e *paramError) Error() string { return e.Code + ": " + e.Message }

// Defaults and bounds of spec 4.3 and 8.
const (
	defaultLimit = 25
	maxLimit     = 100
)

// listParams are the query parameters the list route reads; any other
// parameter is ignored (spec: unknown parameters do not fail a request).
var listParams = map[string]string{
	"lang": "invalid_lang", "limit": "invalid_limit", "cursor": "invalid_cursor",
	"updated_after": "invalid_updated_after", "status": "invalid_status",
}

// readParams splits a raw query into the known parameters. A known parameter
// given twice, or whose value is not valid percent-encoding, is refused with
// its own code; an unknown or undecodable name is ignored.
func readParams(rawQuery string, known map[string]string) (map[string]string, error) {
	params := map[string]string{}
	for pair := range strings.SplitSeq(rawQuery, "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil {
			continue
		}
		code, ok := known[key]
		if !ok {
			continue
		}
		if _, dup := params[key]; dup {
			return nil, &paramError{code, key + " must be given at most once"}
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return nil, &paramError{code, key + " is not valid percent-encoding"}
		}
		params[key] = value
	}
	return params, nil
}

// parseList validates the list route's parameters into a query (without the
// owner, which comes from the identity).
func parseList(rawQuery string) (export.Query, error) {
	p, err := readParams(rawQuery, listParams)
	if err != nil {
		return export.Query{}, err
	}
	q := export.Query{Lang: "ENG", Limit: defaultLimit}
	if v, ok := p["lang"]; ok {
		if q.Lang, err = parseLang(v); err != nil {
			return export.Query{}, err
		}
	}
	if v, ok := p["limit"]; ok {
		if q.Limit, err = parseLimit(v); err != nil {
			return export.Query{}, err
		}
	}
	if v, ok := p["status"]; ok {
		if v != "active" && v != "inactive" {
			return export.Query{}, &paramError{"invalid_status", "status must be active or inactive"}
		}
		q.Status = v
	}
	if v, ok := p["updated_after"]; ok {
		t, err := parseUpdatedAfter(v)
		if err != nil {
			return export.Query{}, err
		}
		q.UpdatedAfter = &t
	}
	if v, ok := p["cursor"]; ok {
		if v == "" {
			return export.Query{}, &paramError{"invalid_cursor", "cursor must not be empty; pass meta.next_cursor unchanged"}
		}
		q.Cursor = v
	}
	return q, nil
}

func parseLang(v string) (string, error) {
	switch v {
	case "ENG", "RUS", "UKR":
		return v, nil
	}
	return "", &paramError{"invalid_lang", "lang must be one of ENG, RUS, UKR"}
}

func parseLimit(v string) (int, error) {
	err := &paramError{"invalid_limit", fmt.Sprintf("limit must be an integer from 1 to %d", maxLimit)}
	// Leading zeros are allowed, however many ("0005" is 5, as "05" is).
	digits := strings.TrimLeft(v, "0")
	if v == "" || len(digits) > 3 || strings.Trim(v, "0123456789") != "" {
		return 0, err
	}
	n, _ := strconv.Atoi(digits)
	if n < 1 || n > maxLimit {
		return 0, err
	}
	return n, nil
}

// parseItem validates the item route's parameters: lang only.
func parseItem(rawQuery string) (string, error) {
	p, err := readParams(rawQuery, map[string]string{"lang": "invalid_lang"})
	if err != nil {
		return "", err
	}
	if v, ok := p["lang"]; ok {
		return parseLang(v)
	}
	return "ENG", nil
}
