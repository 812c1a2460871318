package contentcoding

import "testing"

func TestAcceptsGzip(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   []string
		want bool
	}{
		{nil, false},
		{[]string{"gzip"}, true},
		{[]string{"br, GZIP;q=0.5"}, true},
		{[]string{"deflate", "gzip"}, true},
		{[]string{"*"}, true},
		{[]string{"gzip;q=0"}, false},
		{[]string{"gzip; q=0.0"}, false},
		{[]string{"identity"}, false},
		{[]string{"x-gzip2"}, false},
		{[]string{"x-gzip"}, true},
		{[]string{"gzip;Q=0"}, false},
		{[]string{"gzip;q=NaN"}, false},
		{[]string{"gzip;q=NaN, *"}, false},
		{[]string{"gzip;q=2"}, false},
		{[]string{"*;q=0"}, false},
		// "*" stands for the codings not listed: gzip refused by name
		// stays refused, whatever order (RFC 9110 12.5.3).
		{[]string{"gzip;q=0, *"}, false},
		{[]string{"*, gzip;q=0"}, false},
		{[]string{"*;q=0.5", "gzip; q=0"}, false},
		{[]string{"gzip;q=0.5, *;q=0"}, true},
		{[]string{"br, *;q=0.1"}, true},
		{[]string{"identity, *;q=0"}, false},
	} {
		if got := AcceptsGzip(tt.in); got != tt.want {
			t.Errorf("AcceptsGzip(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
