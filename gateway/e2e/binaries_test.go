package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The binaries of a test binary that died without its TestMain's removal
// (a test's panic, go test's -timeout) are removed by a later one; a live
// process's, a folder too young to tell, and any other folder are kept.
func TestOrphanedBinariesAreRemoved(t *testing.T) {
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	dead, live := strconv.Itoa(ended.Process.Pid), strconv.Itoa(os.Getpid())
	parent := t.TempDir()
	folders := []struct {
		name           string
		young, removed bool
	}{
		{binariesPrefix + dead + "-1", false, true},
		{binariesPrefix + live + "-2", false, false},
		{binariesPrefix + dead + "-3", true, false},
		{binariesPrefix + "4", false, false}, // no owner
		{"other-" + dead + "-5", false, false},
	}
	long := time.Now().Add(-2 * time.Hour)
	for _, f := range folders {
		path := filepath.Join(parent, f.name)
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if f.young {
			continue
		}
		if err := os.Chtimes(path, long, long); err != nil {
			t.Fatal(err)
		}
	}
	removeOrphanedBinaries(parent, time.Hour)
	for _, f := range folders {
		if _, err := os.Stat(filepath.Join(parent, f.name)); os.IsNotExist(err) != f.removed {
			t.Errorf("%s removed: %v, want %v", f.name, os.IsNotExist(err), f.removed)
		}
	}
}
