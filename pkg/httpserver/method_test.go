package httpserver

import (
	"strings"
	"testing"
	"unsafe"
)

func TestStableMethod(t *testing.T) {
	for m, want := range map[string]string{
		"GET": "GET", "HEAD": "HEAD", "POST": "POST", "PUT": "PUT", "DELETE": "DELETE",
		"CONNECT": "CONNECT", "OPTIONS": "OPTIONS", "TRACE": "TRACE", "PATCH": "PATCH",
		"get": MethodOther, "FOO": MethodOther, "": MethodOther, "GET ": MethodOther,
	} {
		// A copy in a buffer of its own, as a request's method would be.
		buf := []byte(strings.Clone(m))
		got := StableMethod(unsafe.String(unsafe.SliceData(buf), len(buf)))
		for i := range buf {
			buf[i] = 'x' // the buffer is reused: the result must not change
		}
		if got != want {
			t.Errorf("StableMethod(%q) = %q, want %q", m, got, want)
		}
	}
}
