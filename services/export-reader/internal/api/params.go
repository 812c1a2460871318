package api

import (
	"errors"
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

// routeParams are the query parameters a route reads, each with the
// error.code its bad values get, in the spec's order.
type routeParams []struct{ name, code string }

// code returns the parameter's error.code, or false for a name the route
// does not read.
func (rp routeParams) code(name string) (string, bool) {
	for _, p := range rp {
		if p.name == name {
			return p.code, true
		}
	}
	return "", false
}

func (rp routeParams) names() string {
	names := make([]string, len(rp))
	for i, p := range rp {
		names[i] = p.name
	}
	return strings.Join(names, ", ")
}

// The parameters of spec 4.3 and 4.4.
var (
	listParams = routeParams{{"lang", "invalid_lang"}, {"cursor", "invalid_cursor"}, {"limit", "invalid_limit"},
		{"updated_after", "invalid_updated_after"}, {"status", "invalid_status"}}
	itemParams = routeParams{{"lang", "invalid_lang"}}
)

// readParams splits a raw query into the route's parameters. Every other
// name is refused (invalid_parameter): a misspelt updated_after or a
// "Lang" would otherwise be a silent full sync or a page in English. A
// parameter given twice, or whose value is not valid percent-encoding, is
// refused with its own code.
func readParams(rawQuery string, known routeParams) (map[string]string, error) {
	params := map[string]string{}
	for pair := range strings.SplitSeq(rawQuery, "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil {
			return nil, &paramError{"invalid_parameter", "a query parameter name is not valid percent-encoding"}
		}
		code, ok := known.code(key)
		if !ok {
			return nil, &paramError{"invalid_parameter", unknownParamMessage(key, known)}
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

// unknownParamMessage names the unknown parameter when it looks like a
// name (a long or odd one is not repeated: it could be anything, a key
// included) and lists the route's parameters.
func unknownParamMessage(name string, known routeParams) string {
	unknown := "an unknown query parameter"
	if len(name) <= 32 && strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == "" {
		unknown = fmt.Sprintf("unknown query parameter %q", name)
	}
	return unknown + "; this route reads only " + known.names() + " (names in lower case)"
}

// parseList validates the list route's parameters into a query (without the
// owner, which comes from the identity).
func parseList(rawQuery string) (export.Query, error) {
	p, err := readParams(rawQuery, listParams)
	if err != nil {
		return export.Query{}, err
	}
	q, err := listQuery(p)
	return q, hintSeparator(err, p, listParams)
}

// listQuery validates the list route's parameters, read by readParams.
func listQuery(p map[string]string) (export.Query, error) {
	var err error
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
	p, err := readParams(rawQuery, itemParams)
	if err != nil {
		return "", err
	}
	if v, ok := p["lang"]; ok {
		lang, err := parseLang(v)
		return lang, hintSeparator(err, p, itemParams)
	}
	return "ENG", nil
}

// hintSeparator adds to a refused value's message that query parameters
// are separated by '&', when the value holds ";name=" for a parameter the
// route reads: "limit=1;lang=RUS" was refused as a limit that is no
// integer, and its client was left to guess why. The code stays the
// value's.
func hintSeparator(err error, p map[string]string, known routeParams) error {
	var pe *paramError
	if !errors.As(err, &pe) {
		return err
	}
	for _, refused := range known {
		if refused.code != pe.Code {
			continue
		}
		for _, other := range known {
			if strings.Contains(p[refused.name], ";"+other.name+"=") {
				return &paramError{pe.Code, pe.Message + "; separate query parameters with &, not ;"}
			}
		}
	}
	return err
}
