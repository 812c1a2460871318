package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// The README says every scenario's flags are listed by "loadgen SCENARIO
// -h": that is a request answered (flag.ErrHelp, which main exits 0 on),
// not an invalid usage followed by the scenarios' list and exit 2.
func TestHelpIsAnsweredNotRefused(t *testing.T) {
	noEnv := func(string) string { return "" }
	for name := range scenarios {
		err := run(context.Background(), []string{name, "-h"}, noEnv, &bytes.Buffer{})
		if !errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) {
			t.Errorf("loadgen %s -h: got %v, want flag.ErrHelp alone", name, err)
		}
	}
	for _, word := range []string{"-h", "--help", "help"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{word}, noEnv, &out); err != nil {
			t.Errorf("loadgen %s: %v", word, err)
		}
		if !strings.HasPrefix(out.String(), "usage: loadgen SCENARIO") {
			t.Errorf("loadgen %s printed %q, want the usage", word, out.String())
		}
	}
	if err := run(context.Background(), []string{"scan", "--limt", "5"}, noEnv, &bytes.Buffer{}); !errors.Is(err, errUsage) {
		t.Errorf("a misspelt flag: got %v, want an invalid usage", err)
	}
}
