package api

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
	} {
		if got := acceptsGzip(tt.in); got != tt.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
