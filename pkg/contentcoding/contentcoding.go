// Package contentcoding reads a request's Accept-Encoding and sends an
// answer compressed as it allows, for the services that compress their
// answers (export-reader's pages, shop-schema's schema).
package contentcoding

import (
	"strconv"
	"strings"
)

// AcceptsGzip reads Accept-Encoding as RFC 9110 (12.5.3) does: gzip is
// acceptable when listed (as gzip or x-gzip) with a q above 0, or, when not
// listed at all, when "*" is with a q above 0. So "gzip;q=0, *" refuses
// gzip: "*" stands only for the codings not named.
func AcceptsGzip(values []string) bool {
	named, star := -1.0, -1.0 // the q of gzip and of "*"; -1 when absent
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			switch strings.ToLower(strings.TrimSpace(coding)) {
			case "gzip", "x-gzip":
				named = max(named, weight(params))
			case "*":
				star = max(star, weight(params))
			}
		}
	}
	if named >= 0 {
		return named > 0
	}
	return star > 0
}

// weight is the q of an Accept-Encoding element's parameters: 1 without
// one, 0 for one that is not a number from 0 to 1 (not acceptable, rather
// than guessed).
func weight(params string) float64 {
	for param := range strings.SplitSeq(params, ";") {
		name, value, _ := strings.Cut(param, "=")
		if !strings.EqualFold(strings.TrimSpace(name), "q") {
			continue
		}
		q, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil || !(q >= 0 && q <= 1) { // NaN too
			return 0
		}
		return q
	}
	return 1
}
