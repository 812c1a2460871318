package envdoc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/google/go-cmp/cmp"
)

func TestReadTable(t *testing.T) {
	got, err := ReadTable("testdata/README.md")
	if err != nil {
		t.Fatal(err)
	}
	gateway, all := []string{"gateway"}, Binaries
	want := []Setting{
		{Name: "FAKE_ADDR", Default: "127.0.0.1:1", Binaries: gateway, Line: 9},
		{Name: "FAKE_ADMIN_ADDR", Default: "127.0.0.1:2", Binaries: gateway, Line: 9},
		{Name: "FAKE_SECRET", Required: true, Binaries: []string{"gateway", "export-reader", "sales-writer"}, Line: 10},
		{Name: "FAKE_A_TIMEOUT", Default: "10s", Binaries: []string{"export-reader"}, Line: 11},
		{Name: "FAKE_B_TIMEOUT", Default: "10s", Binaries: []string{"sales-writer"}, Line: 11},
		{Name: "FAKE_TTL", Default: "30s", Binaries: all, Line: 12},
		{Name: "FAKE_SIZE", Default: "100", Binaries: all, Line: 12},
		{Name: "FAKE_DELAY", Default: "0s", Binaries: []string{"gateway", "shop-schema"}, Line: 13},
		{Name: "FAKE_RATE", Default: "6000-M", Binaries: all, Line: 14},
		{Name: "FAKE_HEADER", Binaries: gateway, Line: 15},
		{Name: "FAKE_STORE_ADDR", Default: "127.0.0.1:4318", MakeRunOnly: true, Line: 16},
		{Name: "OTEL_*", Binaries: all, Line: 17},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadTable (-want +got):\n%s", diff)
	}
}

// A row the rules cannot read is an error naming its line, not a row
// skipped.
func TestReadTableRefusesWhatItCannotRead(t *testing.T) {
	for _, tt := range []struct{ row, want string }{
		{"| `Fake_Addr` | gateway | `1` |", "`Fake_Addr` is not a variable name"},
		{"| no name here | gateway | `1` |", "no variable"},
		{"| `A` | services | `1` |", `no binary "services"`},
		{"| `A` / `B` | gateway / export-reader / sales-writer | `1` |", "3 for 2 variables"},
		{"| `A` | all but nobody | `1` |", `no binary "nobody"`},
	} {
		path := filepath.Join(t.TempDir(), "README.md")
		table := "## Configuration\n\n| variable | binaries | default |\n|---|---|---|\n" + tt.row + "\n"
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTable(path); err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), ":5:") {
			t.Errorf("ReadTable(%s) = %v, want an error at line 5 with %q", tt.row, err, tt.want)
		}
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "STATE": "/s", "EMPTY": ""}
	for _, tt := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$A-${A}", "a-a"},
		{"${B:-def}", "def"},
		{"${A:-def}", "a"},
		{"${EMPTY:-def}", "def"},
		{"${B:-x$STATE/y}", "x/s/y"},
		{"${A:?set A}", "a"},
		{"${B:-}", ""},
		{"$$literal", "$literal"},
	} {
		if got, err := expand(tt.in, vars); err != nil || got != tt.want {
			t.Errorf("expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := expand("${B:?set B}", vars); err == nil || !strings.Contains(err.Error(), "B unset") {
		t.Errorf(`expand("${B:?set B}") = %v, want B unset`, err)
	}
}

// run.sh's $(reachable "ADDR") is read as the script runs it: a listener
// on every address is reached on loopback.
func TestReadRunScriptReadsReachable(t *testing.T) {
	script := filepath.Join(t.TempDir(), "run.sh")
	lines := `export A_ADDR="${A_ADDR:-:8081}"
export A_URLS="${A_URLS:-http://$(reachable "$A_ADDR")}"
export B_URL="http://$(reachable "0.0.0.0:80")/v1"
export C_URL="http://$(reachable "[::]:80"),http://$(reachable "localhost:81")"
`
	if err := os.WriteFile(script, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	env, err := ReadRunScript(script, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"A_URLS": "http://127.0.0.1:8081", "B_URL": "http://127.0.0.1:80/v1",
		"C_URL": "http://[::1]:80,http://localhost:81"} {
		if env[name] != want {
			t.Errorf("%s = %q, want %q", name, env[name], want)
		}
	}
}

// make run's grace is read from its stop_grace line, and a script without
// one is an error, not a grace of 0 (every check would fail, naming the
// wrong cause) or one left unchecked.
func TestReadRunScriptStopGrace(t *testing.T) {
	script := filepath.Join(t.TempDir(), "run.sh")
	for _, tt := range []struct {
		lines string
		want  time.Duration
	}{
		{"stopping=\nstop_grace=${RUN_STOP_GRACE:-35}\nstop_one() {\n", 35 * time.Second},
		{"# stop_grace=${RUN_STOP_GRACE:-35} in a comment\n  stop_grace=${RUN_STOP_GRACE:-35}\n", 0},
		{"stop_grace=35\n", 0}, // the setting's default is what is read
	} {
		if err := os.WriteFile(script, []byte(tt.lines), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ReadRunScriptStopGrace(script)
		if tt.want == 0 && err == nil || tt.want != 0 && (err != nil || got != tt.want) {
			t.Errorf("ReadRunScriptStopGrace(%q) = %s, %v; want %s (0: an error)", tt.lines, got, err, tt.want)
		}
	}
}

// fakeConfig is a binary's Config in small: what the checks compare.
type fakeConfig struct {
	Addr, AdminAddr string
	Timeout         time.Duration
	Secret          string
}

// fakeBinary reads FAKE_ADDR, FAKE_ADMIN_ADDR, FAKE_TIMEOUT (10s), the
// required FAKE_SECRET and, through telemetry, OTEL_SERVICE_NAME.
func fakeBinary(t *testing.T) Binary[fakeConfig] {
	load := func(getenv func(string) string) (fakeConfig, error) {
		r := envconfig.New(getenv)
		c := fakeConfig{
			Addr:      r.Addr("FAKE_ADDR", "127.0.0.1:8080"),
			AdminAddr: r.Addr("FAKE_ADMIN_ADDR", "127.0.0.1:9080"),
			Timeout:   r.Duration("FAKE_TIMEOUT", 10*time.Second, time.Millisecond, time.Hour),
			Secret:    r.SigningSecret("FAKE_SECRET"),
		}
		getenv("OTEL_SERVICE_NAME")
		return c, r.Err()
	}
	base := map[string]string{"FAKE_SECRET": Secrets["IDENTITY_SECRET"]}
	rec := &Recorder{Env: base}
	if _, err := load(rec.Getenv); err != nil {
		t.Fatal(err)
	}
	return Binary[fakeConfig]{Name: "gateway", Load: load, Read: rec.Names(), Base: base,
		Listeners: func(c fakeConfig) (string, string) { return c.Addr, c.AdminAddr }, HealthPath: "/health",
		Settings: func(fakeConfig) []string { return []string{"FAKE_ADDR", "FAKE_ADMIN_ADDR", "FAKE_SECRET"} }}
}

func TestCheckTable(t *testing.T) {
	rows := map[string]Setting{
		"addr":    {Name: "FAKE_ADDR", Default: "127.0.0.1:8080"},
		"admin":   {Name: "FAKE_ADMIN_ADDR", Default: "127.0.0.1:9080"},
		"timeout": {Name: "FAKE_TIMEOUT", Default: "10000ms"}, // the same duration, written otherwise
		"secret":  {Name: "FAKE_SECRET", Required: true},
		"otel":    {Name: "OTEL_*"},
	}
	table := func(change func(map[string]Setting)) []Setting {
		m := map[string]Setting{}
		for k, v := range rows {
			m[k] = v
		}
		change(m)
		var out []Setting
		for _, s := range m {
			out = append(out, s)
		}
		return out
	}
	b := fakeBinary(t)
	for _, tt := range []struct {
		name   string
		change func(map[string]Setting)
		want   string // in the one problem; "" for none
	}{
		{"as read", func(map[string]Setting) {}, ""},
		{"a default that is not the code's", func(m map[string]Setting) { m["timeout"] = Setting{Name: "FAKE_TIMEOUT", Default: "15s"} },
			`FAKE_TIMEOUT's documented default "15s" is not the default in code: Timeout is 10s unset, 15s with the documented default`},
		{"a default the loader refuses", func(m map[string]Setting) { m["timeout"] = Setting{Name: "FAKE_TIMEOUT", Default: "10"} },
			"FAKE_TIMEOUT=10, its documented default, is refused"},
		{"a variable read but missing", func(m map[string]Setting) { delete(m, "admin") }, "gateway reads FAKE_ADMIN_ADDR, which its table lacks"},
		{"a family read but missing", func(m map[string]Setting) { delete(m, "otel") }, "gateway reads the OTEL_* variables, which its table lacks"},
		{"a row not read (misspelt)", func(m map[string]Setting) {
			m["timeout"] = Setting{Name: "FAKE_TIMEOUT", Default: "10s"}
			m["x"] = Setting{Name: "FAKE_TIMEUOT"}
		},
			"FAKE_TIMEUOT is in the table, but gateway does not read it"},
		{"required, but not", func(m map[string]Setting) { m["addr"] = Setting{Name: "FAKE_ADDR", Required: true} },
			"FAKE_ADDR is documented as required, but FAKE_ADDR unset loads"},
		{"required, but not said", func(m map[string]Setting) { m["secret"] = Setting{Name: "FAKE_SECRET"} },
			"FAKE_SECRET unset is refused, but the table does not say it is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := b.CheckTable(table(tt.change))
			if tt.want == "" && len(got) > 0 || tt.want != "" && (len(got) != 1 || !strings.Contains(got[0], tt.want)) {
				t.Errorf("CheckTable = %q, want one problem with %q", got, tt.want)
			}
		})
	}
}

func TestCheckRootTable(t *testing.T) {
	b := fakeBinary(t)
	table := []Setting{
		{Name: "FAKE_ADDR", Default: "127.0.0.1:8080", Binaries: []string{"gateway"}, Line: 1},
		{Name: "FAKE_TIMEOUT", Default: "10s", Binaries: []string{"export-reader"}, Line: 2},
		{Name: "FAKE_OTHER", Binaries: []string{"gateway", "sales-writer"}, Line: 3},
		{Name: "FAKE_STORE_ADDR", MakeRunOnly: true, Line: 4},
		{Name: "OTEL_SERVICE_NAME", Binaries: Binaries, Line: 5},
	}
	want := []string{
		"line 2: gateway reads FAKE_TIMEOUT, but the table's binaries (export-reader) leave it out",
		"line 3: the table says gateway reads FAKE_OTHER, but it does not",
	}
	if diff := cmp.Diff(want, b.CheckRootTable(table)); diff != "" {
		t.Errorf("CheckRootTable (-want +got):\n%s", diff)
	}
}

func TestCheckEnv(t *testing.T) {
	b := fakeBinary(t)
	env := map[string]string{"FAKE_SECRET": Secrets["IDENTITY_SECRET"], "FAKE_TIMOUT": "5s", "GOMEMLIMIT": "1GiB",
		"OTEL_TRACES_SAMPLER": "always_on", "PGPASSWORD": "x", "FAKE_ADDR": "nowhere"}
	_, got := b.CheckEnv(env)
	want := []string{
		"sets FAKE_TIMOUT, which gateway does not read (did you mean FAKE_TIMEOUT?)",
		"sets PGPASSWORD, which gateway does not read", // it reads no DATABASE_URL
		`gateway refuses the values: config: FAKE_ADDR must be host:port, such as 127.0.0.1:8080 (got "nowhere")`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CheckEnv (-want +got):\n%s", diff)
	}
	_, got = b.CheckSharedEnv(map[string]string{"FAKE_SECRET": Secrets["IDENTITY_SECRET"], "FAKE_TIMOUT": "5s", "OTHER_BINARYS_SETTING": "1"})
	if want := []string{"sets FAKE_TIMOUT, which no binary reads: a misspelling of gateway's FAKE_TIMEOUT?"}; !cmp.Equal(want, got) {
		t.Errorf("CheckSharedEnv = %q, want %q", got, want)
	}
}

func TestCheckMisspellingHints(t *testing.T) {
	got := fakeBinary(t).CheckMisspellingHints()
	want := []string{"gateway reads FAKE_TIMEOUT, but its Config.Settings lacks it: a misspelling of it would be ignored without a warning"}
	if diff := cmp.Diff(want, got); diff != "" { // OTEL_SERVICE_NAME is the SDK's family's
		t.Errorf("CheckMisspellingHints (-want +got):\n%s", diff)
	}
}

// A required setting is refused by name, not by a longer name that
// starts with it.
func TestNamesSetting(t *testing.T) {
	for _, tt := range []struct {
		err  string
		want bool
	}{
		{"CURSOR_SECRET is required", true},
		{"bad settings: CURSOR_SECRET: too short", true},
		{"CURSOR_SECRET_PREVIOUS: too short", false},
		{"OLD_CURSOR_SECRET is required", false},
	} {
		if got := namesSetting(errors.New(tt.err), "CURSOR_SECRET"); got != tt.want {
			t.Errorf("namesSetting(%q, CURSOR_SECRET) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
