package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReadRecordsKeepsTheLastOfAName(t *testing.T) {
	in := `{"scenario":"scan","figures":{"items_per_s":1}}
{"scenario":"scan","figures":{"items_per_s":2}}

{"scenario":"sales","figures":{"pairs_per_s":3}}
`
	got, err := readRecords(strings.NewReader(in))
	if err != nil {
		t.Fatalf("readRecords() error %v", err)
	}
	for name, want := range map[string]float64{"scan": 2, "sales": 3} {
		if v := throughput(got[name]); v != want {
			t.Errorf("readRecords()[%s] throughput = %v, want %v", name, v, want)
		}
	}
	if _, err := readRecords(strings.NewReader("{broken\n")); err == nil {
		t.Errorf("readRecords(broken) = nil error, want one")
	}
}

func TestBestOfRounds(t *testing.T) {
	in := map[string]Record{
		"get_nginx_64#1":   {Scenario: "get_nginx_64#1", Figures: map[string]float64{"rps": 100, "p99_ms": 9, "errors": 4}},
		"get_nginx_64#2":   {Scenario: "get_nginx_64#2", Figures: map[string]float64{"rps": 300, "p99_ms": 5, "errors": 0}},
		"get_nginx_64#3":   {Scenario: "get_nginx_64#3", Figures: map[string]float64{"rps": 200, "p99_ms": 7}},
		"get_gateway_64#1": {Scenario: "get_gateway_64#1", Figures: map[string]float64{"rps": 150}},
		"scan":             {Scenario: "scan", Figures: map[string]float64{"items_per_s": 5}},
	}
	got := bestOfRounds(in)
	want := map[string]Record{
		"get_nginx_64":   {Scenario: "get_nginx_64", Figures: map[string]float64{"rps": 300, "p99_ms": 5, "errors": 4, "rounds": 3, "worst_round": 100}},
		"get_gateway_64": {Scenario: "get_gateway_64", Figures: map[string]float64{"rps": 150, "rounds": 1, "worst_round": 150}},
		"scan":           {Scenario: "scan", Figures: map[string]float64{"items_per_s": 5}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bestOfRounds() mismatch (-want +got):\n%s", diff)
	}
}
