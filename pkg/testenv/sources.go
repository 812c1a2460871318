package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ReadSourcesOf opens the folder of every package of the workspace that
// pkgs are built from (with its embedded files' folders, and each module's
// root: go.mod, go.sum), and go.work, so that go test's cache covers what a
// test builds from them and runs (a binary, started as a process): the
// test binary imports none of it, and go test without -count=1 returned a
// cached pass after it changed. The cache keeps, with a result, what the
// test opened (for a folder, the size and time of each file in it:
// cmd/go's hashOpen), but only within the test's module, module (its
// root's path): what lies outside it, in the workspace's root (module's
// parent), is opened through links, one for each entry of that root the
// test needs, in the folder links within the module (testdata/workspace).
func ReadSourcesOf(module, links string, pkgs ...string) error {
	args := append([]string{"list", "-deps", "-f",
		`{{if and .Module .Module.Main}}{{.Dir}}{{"\n"}}{{.Module.Dir}}{{range .EmbedFiles}}{{"\n"}}{{$.Dir}}/{{.}}{{end}}{{"\n"}}{{end}}`}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return fmt.Errorf("go list the sources of %v: %w", pkgs, err)
	}
	inputs := map[string]bool{filepath.Join(links, "go.work"): true, filepath.Join(links, "go.work.sum"): true}
	for line := range strings.Lines(string(out)) {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if info, err := os.Stat(line); err == nil && !info.IsDir() { // an embedded file
			line = filepath.Dir(line)
		}
		if rel, err := filepath.Rel(module, line); err == nil && filepath.IsLocal(rel) {
			inputs[line] = true
		} else if rel, err := filepath.Rel(filepath.Dir(module), line); err == nil && filepath.IsLocal(rel) {
			inputs[filepath.Join(links, rel)] = true
		} else {
			return fmt.Errorf("%s is outside the workspace", line)
		}
	}
	for input := range inputs {
		f, err := os.Open(input)
		if err != nil {
			return fmt.Errorf("%w (%s lacks a link?)", err, links)
		}
		f.Close()
	}
	return nil
}
