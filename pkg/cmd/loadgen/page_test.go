package main

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/coinexport/export/pkg/envelope"
)

func TestScanPage(t *testing.T) {
	tests := []struct {
		name string
		body string
		want page
	}{
		{"two items and a cursor",
			`{"data":[{"id":"a","title":"x"},{"id":"b","images":[{"id":"i"}]}],"meta":{"request_id":"r","next_cursor":"c2"}}`,
			page{Items: 2, NextCursor: "c2"}},
		{"meta first, spaces, last page",
			` { "meta" : {"request_id":"r","next_cursor":null} , "data" : [ {"a":1} ] } `,
			page{Items: 1}},
		{"brackets and quotes inside strings",
			`{"data":[{"t":"a]},\"{[b"},{"t":"\\"}],"meta":{"request_id":"r"}}`,
			page{Items: 2}},
		{"empty data", `{"data":[],"meta":{"request_id":"r"}}`, page{}},
		{"scalars in data", `{"data":[1,"x",null,true],"meta":{"request_id":"r"}}`, page{Items: 4}},
		{"error envelope",
			`{"error":{"code":"unauthenticated","message":"m"},"meta":{"request_id":"r"}}`,
			page{Error: &envelope.ErrorBody{Code: "unauthenticated", Message: "m"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := scanPage([]byte(tt.body))
			if err != nil {
				t.Fatalf("scanPage(%s) error %v", tt.body, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("scanPage(%s) mismatch (-want +got):\n%s", tt.body, diff)
			}
		})
	}
}

func TestScanPageRejectsBrokenBodies(t *testing.T) {
	for _, body := range []string{
		``,
		`[]`,
		`{"data":[{"id":"a"},{"id":"b"`, // truncated mid-page
		`{"data":[{"id":"a"}],"meta":{"request_id":"r"}`,
		`{"data":{"id":"a"},"meta":{"request_id":"r"}}`,
		`{"data":[{"id":"a}],"meta":{}}`,
		`{"data":[1 2],"meta":{}}`,
		`{"data":[],"meta":{}} trailing`,
		`{data:[]}`,
	} {
		if got, err := scanPage([]byte(body)); !errors.Is(err, errMalformed) {
			t.Errorf("scanPage(%q) = %+v, %v, want errMalformed", body, got, err)
		}
	}
}
