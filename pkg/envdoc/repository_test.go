package envdoc

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/gcdefaults"
)

// root is the repository's root, from this package's folder, through a
// link inside the pkg module: go test's cache rechecks the files a test
// opened only within its module, and through "../.." a change to a README
// or a deploy file would be answered from the cache.
const root = "testdata/repository"

// walkRepository calls visit with the path of each file of the repository
// (links included, not followed) but those under .git, .run and build
// output (bin, node_modules) or a folder skip names.
func walkRepository(skip func(folder string) bool, visit func(path string) error) error {
	// WalkDir does not follow a root that is a link; given as a folder
	// ("…/"), the link is followed to it.
	return filepath.WalkDir(root+"/", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch name := d.Name(); {
		case !d.IsDir():
			return visit(path)
		case path != root+"/" && (strings.HasPrefix(name, ".") || name == "bin" || name == "node_modules" || skip(name)):
			return filepath.SkipDir
		}
		return nil
	})
}

// noFolder leaves no folder out of walkRepository's walk but its own.
func noFolder(string) bool { return false }

// documented are the variables of every configuration table: the root
// README's and each binary's.
func documented(t *testing.T) map[string]bool {
	names := map[string]bool{}
	for _, readme := range []string{"README.md", "gateway/README.md", "services/export-reader/README.md",
		"services/sales-writer/README.md", "services/shop-schema/README.md"} {
		settings, err := ReadTable(filepath.Join(root, readme))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range settings {
			names[s.Name] = true
		}
	}
	return names
}

// make run gives its environment to every binary, so no binary's test can
// tell a variable meant for another from one no binary reads: each one it
// sets must be in a table (each binary's test holds its table to what it
// reads, and its values to what it accepts).
func TestMakeRunSetsDocumentedVariablesOnly(t *testing.T) {
	env, err := ReadRunScript(filepath.Join(root, RunScriptFile), map[string]string{"state": "/run", "state_in_url": "/run"}, Secrets)
	if err != nil {
		t.Fatal(err)
	}
	known := documented(t)
	for name := range env {
		if f, ok := familyOf(name); ok {
			name = f.entry
		}
		// BASE_URL is the demo's, for the commands make run prints.
		if !known[name] && name != "BASE_URL" {
			t.Errorf("%s exports %s, which no configuration table has", RunScriptFile, name)
		}
	}
	if len(env) < 10 {
		t.Errorf("%s: read %d variables, want the dozen it sets", RunScriptFile, len(env))
	}
}

// A setting the root table gives to make run alone is read by its script,
// with the default the table says.
func TestMakeRunOnlySettingsAreTheScripts(t *testing.T) {
	settings, err := ReadTable(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, RunScriptFile))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(settings, func(s Setting) bool { return s.MakeRunOnly })
	if i < 0 {
		t.Fatal("the root table has no make-run-only setting (TRACESTORE_ADDR)")
	}
	for _, s := range settings[i:] {
		if !s.MakeRunOnly {
			continue
		}
		uses := regexp.MustCompile(`\$\{`+s.Name+`:-([^}]*)\}`).FindAllStringSubmatch(string(script), -1)
		if len(uses) == 0 {
			t.Errorf("README.md:%d: %s is make run's, but %s never reads it", s.Line, s.Name, RunScriptFile)
		}
		for _, use := range uses {
			if use[1] != s.Default {
				t.Errorf("README.md:%d: %s is make run's with default %s, but %s has %s", s.Line, s.Name, s.Default, RunScriptFile, use[0])
			}
		}
	}
}

// The image builds with go.work's toolchain: the golang image sets
// GOTOOLCHAIN=local, so an image left behind when the toolchain line moves
// would build with its own, older Go, and ship the vulnerabilities the
// move was for (make vulncheck).
func TestDockerImageIsTheWorkspaceToolchain(t *testing.T) {
	toolchain := firstMatch(t, "go.work", `(?m)^toolchain go(\S+)$`)
	image := firstMatch(t, "deploy/docker/Dockerfile", `(?m)^FROM golang:([0-9.]+)-`)
	if image != toolchain {
		t.Errorf("deploy/docker/Dockerfile builds with golang:%s, go.work's toolchain is go%s: bump the two together", image, toolchain)
	}
}

// Every deploy/local script that runs the go command takes go.work's
// toolchain as make does: lib.sh exports GOTOOLCHAIN=auto (unless set), as
// the README promises of make and of these scripts. A script run alone
// without it, where the machine's Go is set to local, builds and tests
// with that older Go.
func TestLocalScriptsRunGoWithTheWorkspaceToolchain(t *testing.T) {
	scripts, err := filepath.Glob(filepath.Join(root, "deploy/local/*.sh"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("deploy/local/*.sh: %v, %d scripts", err, len(scripts))
	}
	runsGo := regexp.MustCompile(`(?m)^[^#]*\bgo (build|env|list|mod|run|test)\b`)
	sourcesLib := regexp.MustCompile(`(?m)^\s*\. deploy/local/lib\.sh\b`)
	for _, script := range scripts {
		text, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		if runsGo.Match(text) && !sourcesLib.Match(text) {
			t.Errorf("%s runs go without sourcing deploy/local/lib.sh, which exports GOTOOLCHAIN=auto", filepath.Base(script))
		}
	}
}

// firstMatch is the first submatch of pattern in the repository's file.
func firstMatch(t *testing.T, file, pattern string) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(pattern).FindSubmatch(text)
	if m == nil {
		t.Fatalf("%s: no match for %s", file, pattern)
	}
	return string(m[1])
}

// A Deployment that an autoscaler scales leaves its replica count to it:
// with spec.replicas in the file, every `kubectl apply` of it (a release, a
// rollback, any edit) set the count back to that number, and took an
// export-reader fleet the autoscaler had grown under load back to its
// minimum until the autoscaler caught up again (Kubernetes' HPA
// documentation, "Migrating Deployments and StatefulSets to horizontal
// autoscaling").
func TestAutoscaledDeploymentsLeaveTheirReplicasToTheAutoscaler(t *testing.T) {
	m, err := ReadManifest(filepath.Join(root, ManifestFile), Secrets)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Autoscalers) == 0 {
		t.Fatalf("%s: no HorizontalPodAutoscaler (export-reader's)", ManifestFile)
	}
	for name, hpa := range m.Autoscalers {
		dep, ok := m.Deployments[hpa.TargetName]
		switch {
		case hpa.TargetKind != "Deployment" || !ok:
			t.Errorf("%s: HorizontalPodAutoscaler %s scales %s %s, which the file does not have", ManifestFile, name, hpa.TargetKind, hpa.TargetName)
		case dep.Replicas != nil:
			t.Errorf("%s: Deployment %s sets replicas: %d, but HorizontalPodAutoscaler %s scales it: each kubectl apply would reset the count it chose", ManifestFile, hpa.TargetName, *dep.Replicas, name)
		}
	}
}

// Every test, fuzz test or benchmark a document names exists: the READMEs,
// BENCHMARKS.md and gateway/e2e/SPEC-MAP.md cite some 700 of them as the
// proof of what they say, and a renamed one left its citation pointing at
// nothing (BENCHMARKS.md still named a benchmark renamed long before). The
// code's comments, the scripts and the deploy files cite as many more
// (a test named as the proof of a line; openapi.yaml, alerts.yml), and
// are read too. A name that ends in * stands for the tests that start
// with it.
func TestEveryTestTheDocumentsNameExists(t *testing.T) {
	defined := map[string]bool{}
	var documents []string
	err := walkRepository(noFolder, func(path string) error {
		if strings.HasSuffix(path, "_test.go") {
			text, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range testFunc.FindAllSubmatch(text, -1) {
				defined[string(m[1])] = true
			}
		}
		if citing(path) {
			documents = append(documents, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cited := 0
	for _, doc := range documents {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testName.FindAllSubmatch(text, -1) {
			name, glob := string(m[1]), len(m[2]) > 0
			if notATest[name] {
				continue
			}
			cited++
			if !defined[name] && !(glob && anyStartsWith(defined, name)) {
				t.Errorf("%s names %s, which no _test.go defines (renamed or removed? keep the document true)", strings.TrimPrefix(doc, root+"/"), string(m[0]))
			}
		}
	}
	if len(defined) < 500 || cited < 500 {
		t.Errorf("read %d tests defined and %d citations, want the hundreds the repository holds", len(defined), cited)
	}
}

// citing reports whether path is a file that may cite tests: a document,
// Go source (its comments), a script or a deploy file. Not a fuzz corpus
// or other testdata file, whose bytes are data.
func citing(path string) bool {
	if strings.Contains(filepath.ToSlash(path), "/testdata/") && !strings.HasSuffix(path, ".md") {
		return false
	}
	switch filepath.Ext(path) {
	case ".md", ".go", ".yaml", ".yml", ".sh", ".sql":
		return true
	}
	return filepath.Base(path) == "Makefile"
}

// notATest are names the citation pattern matches that are no test: the
// field of go list that deploy/local/fuzz.sh reads.
var notATest = map[string]bool{"TestGoFiles": true}

// anyStartsWith reports whether a name in names starts with prefix.
func anyStartsWith(names map[string]bool, prefix string) bool {
	for name := range names {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

var (
	testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark|Example)\w*)\(`)
	testName = regexp.MustCompile(`\b((?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*)(\*?)`)
)

// Each test gateway/e2e/SPEC-MAP.md names is in a file or folder its
// citation names (the tests, then where they are, up to a ';'; a file
// named alone, sale_test.go, is in the folder named last): a test that
// exists elsewhere passed TestEveryTestTheDocumentsNameExists while the map
// sent its reader to the wrong package (TestItem, export-reader's, was
// cited in pkg/catalog/render_test.go), or to the wrong file of the right
// one (gateway/edge's tests split out of edge_test.go were still cited
// there). A file may be the helper's that does the checking, where the
// citation names that helper ("TestOpenAPIDescribesTheStack
// (checkInProgress), gateway/e2e/openapi_codes_test.go"). A citation that
// names no file is not checked.
func TestSpecMapNamesEachTestsFolder(t *testing.T) {
	defines := map[string]map[string]bool{} // a _test.go file and its folder, from the root → tests defined there
	helpers := map[string][]string{}        // a _test.go file → the other functions it defines
	err := walkRepository(noFolder, func(path string) error {
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		file, _ := filepath.Rel(root, path)
		for _, where := range []string{file, filepath.Dir(file)} {
			if defines[where] == nil {
				defines[where] = map[string]bool{}
			}
			for _, m := range testFunc.FindAllSubmatch(text, -1) {
				defines[where][string(m[1])] = true
			}
		}
		for _, m := range helperFunc.FindAllSubmatch(text, -1) {
			helpers[file] = append(helpers[file], string(m[1]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, "gateway/e2e/SPEC-MAP.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, line := range strings.Split(string(text), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(line, "|") {
			continue
		}
		lastFolder := ""
		for _, citation := range strings.Split(cells[3], ";") {
			var places []string // the files and folders named
			for _, p := range citedPath.FindAllString(citation, -1) {
				if !strings.Contains(p, "/") && lastFolder != "" {
					p = lastFolder + "/" + p
				}
				place := strings.TrimSuffix(p, "/")
				folder := place
				if strings.HasSuffix(p, ".go") {
					folder = filepath.Dir(p)
				}
				places, lastFolder = append(places, place), folder
			}
			if len(places) == 0 {
				continue
			}
			for _, m := range testName.FindAllStringSubmatch(citation, -1) {
				name := m[1]
				found := slices.ContainsFunc(places, func(p string) bool {
					return defines[p][name] || defines[filepath.Dir(p)][name] && namesAny(citation, helpers[p])
				})
				checked++
				if !found && m[2] == "" {
					t.Errorf("SPEC-MAP.md, row §%s %.50s…: %s is in none of %v (name its own file)", strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2]), name, places)
				}
			}
		}
	}
	if checked < 150 {
		t.Errorf("checked %d citations of SPEC-MAP.md, want the hundreds it holds", checked)
	}
}

// helperFunc is a test file's function other than a test (a method
// aside): a helper a citation may name as what does the checking.
var helperFunc = regexp.MustCompile(`(?m)^func ([a-z]\w*)\(`)

// namesAny reports whether text names one of funcs as a word of its own.
func namesAny(text string, funcs []string) bool {
	return slices.ContainsFunc(funcs, func(f string) bool {
		return regexp.MustCompile(`\b` + f + `\b`).MatchString(text)
	})
}

// citedPath is a file or folder of the repository as SPEC-MAP.md names
// one: from the root (gateway/e2e/spec_test.go, services/…/api/), or a
// test file alone.
var citedPath = regexp.MustCompile(`\b(?:(?:gateway|services|pkg|deploy)/[\w./-]*[\w/]|[\w-]+_test\.go)`)

// benchmarkPeakRSS are the peak RSS rows of BENCHMARKS.md's table (loadgen
// rss: VmHWM in MiB), by container name: "| peak RSS, export reader | 116 MB |".
var benchmarkPeakRSS = regexp.MustCompile(`(?m)^\| peak RSS, ([a-z]+(?: [a-z]+)?) \| (\d+) MB \|`)

// Each Deployment's memory request holds its binary's peak RSS measured
// under the bench's load, and its limit stays above the Go soft limit the
// binary runs with. A request below what the pod uses lets the scheduler
// pack nodes past their memory, and a node under pressure evicts first the
// pods using more than they requested: export-reader requested 64Mi while
// BENCHMARKS.md measured it at 116 MB, so every busy reader was the first
// to go. A GOMEMLIMIT at or above the limit would have the pod killed
// before the collector works harder.
func TestMemoryRequestsHoldTheMeasuredPeaks(t *testing.T) {
	m, err := ReadManifest(filepath.Join(root, ManifestFile), Secrets)
	if err != nil {
		t.Fatal(err)
	}
	bench, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	peaks := map[string]int64{}
	for _, row := range benchmarkPeakRSS.FindAllStringSubmatch(string(bench), -1) {
		name := strings.ReplaceAll(row[1], " ", "-")
		if _, ok := m.Containers[name]; ok {
			mib, _ := strconv.ParseInt(row[2], 10, 64)
			peaks[name] = mib << 20
		}
	}
	for _, name := range []string{"gateway", "export-reader", "sales-writer", "shop-schema"} {
		c, ok := m.Containers[name]
		peak, measured := peaks[name]
		switch {
		case !ok:
			t.Errorf("%s: no container %s", ManifestFile, name)
			continue
		case !measured:
			t.Errorf("BENCHMARKS.md: no row \"| peak RSS, %s | N MB |\"", strings.ReplaceAll(name, "-", " "))
		case c.MemoryRequest < peak:
			t.Errorf("%s: %s requests %d MiB of memory, under its peak RSS in BENCHMARKS.md, %d MiB", ManifestFile, name, c.MemoryRequest>>20, peak>>20)
		}
		if soft := goMemoryLimit(t, name, c.Env); soft > 0 && c.MemoryLimit > 0 && soft >= c.MemoryLimit {
			t.Errorf("%s: %s's memory limit, %d MiB, is not above the GOMEMLIMIT it runs with, %d MiB", ManifestFile, name, c.MemoryLimit>>20, soft>>20)
		}
	}
}

// goMemoryLimit is the Go soft memory limit a binary runs with in env: its
// GOMEMLIMIT, else gcdefaults' for the binaries that apply it (README's
// table: the gateway and sales-writer), else 0 (none).
func goMemoryLimit(t *testing.T, binary string, env map[string]string) int64 {
	v, ok := env["GOMEMLIMIT"]
	if !ok || v == "off" {
		if !ok && (binary == "gateway" || binary == "sales-writer") {
			return gcdefaults.MemoryLimit
		}
		return 0
	}
	n, err := quantity(strings.TrimSuffix(v, "B"))
	if err != nil {
		t.Fatalf("%s: %s's GOMEMLIMIT: %v", ManifestFile, binary, err)
	}
	return n
}
