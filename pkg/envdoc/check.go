package envdoc

import (
	"context"
	"fmt"
	"maps"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/telemetry"
)

// Recorder is a getenv that answers from Env and remembers every name it
// was asked for: run a binary's start with it to learn what it reads,
// without a list kept by hand.
type Recorder struct {
	Env   map[string]string
	mu    sync.Mutex
	asked map[string]bool
}

// Getenv answers from Env and records name.
func (r *Recorder) Getenv(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked == nil {
		r.asked = map[string]bool{}
	}
	r.asked[name] = true
	return r.Env[name]
}

// Names are the names asked for, sorted.
func (r *Recorder) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.asked))
}

// ReadAtStart learns what a binary reads: it starts it (start calls the
// binary's run) with a Recorder over base, its two listeners on loopback
// port 0, and a context already done, so that run reads its configuration
// and telemetry's variables, then stops before it reaches PostgreSQL or
// serves anyone. It returns the names asked for.
func ReadAtStart(t testing.TB, base map[string]string, addr, adminAddr string, start func(ctx context.Context, getenv func(string) string) error) []string {
	t.Helper()
	rec := &Recorder{Env: maps.Clone(base)}
	rec.Env[addr], rec.Env[adminAddr] = "127.0.0.1:0", "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := start(ctx, rec.Getenv); err != nil {
		t.Fatalf("run() with a stopped context = %v, want nil", err)
	}
	return rec.Names()
}

// runtimeVariables are read by the Go runtime of every binary, whatever its
// Config reads: a manifest may set them for any binary.
var runtimeVariables = []string{"GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS", "GOTRACEBACK"}

// A family is a table entry such as OTEL_* that stands for the variables
// a library reads from the process environment itself, beyond any getenv:
// a binary reads the family when it hands that library its work.
type family struct {
	entry, prefix string
	readBy        func(read []string) bool
}

var families = []family{
	// pkg/telemetry reads a few OTEL_ variables itself; the OpenTelemetry
	// SDK and exporters read the rest.
	{"OTEL_*", "OTEL_", func(read []string) bool {
		return slices.ContainsFunc(read, func(name string) bool { return strings.HasPrefix(name, "OTEL_") })
	}},
	// pgx fills in what a connection string leaves out from libpq's
	// variables (PGPASSWORD, PGSSLMODE, …), whatever the getenv.
	{"PG*", "PG", func(read []string) bool { return slices.Contains(read, "DATABASE_URL") }},
}

// familyOf is the family name belongs to, if any.
func familyOf(name string) (family, bool) {
	for _, f := range families {
		if name == f.entry || strings.HasPrefix(name, f.prefix) {
			return f, true
		}
	}
	return family{}, false
}

// metricsPath is what the liveness and startup probes ask the admin
// listener for (httpserver.AdminHandler).
const metricsPath = "/metrics"

// Binary is one binary as the checks see it.
type Binary[C any] struct {
	Name string                                      // as in Binaries
	Load func(getenv func(string) string) (C, error) // its config loader
	// Read are the variables the binary reads at start (a Recorder given
	// to its run).
	Read []string
	// Base is a valid environment holding the required settings alone.
	Base map[string]string
	// Listeners are the main and admin listening addresses of a Config.
	Listeners  func(C) (addr, admin string)
	HealthPath string // its readiness check, on the main listener
	// Settings are the names a Config gives its start to warn of a
	// variable set under a name close to one (envconfig.Misspelt).
	Settings func(C) []string
	// Stop is the longest the binary takes to exit after SIGTERM (serving
	// on, draining, the last flush of spans); nil for a command that
	// serves nothing. A grace period no longer than that has the binary
	// killed while it drains.
	Stop func(C) time.Duration
	// Drain is how long a service the gateway relays to lets its calls in
	// flight run after SIGTERM (its httpserver ShutdownTimeout); nil for
	// the gateway and commands. The gateway's own drain must be no
	// shorter (checkGatewayDrain).
	Drain func(C) time.Duration
}

// ServiceStop is a Stop for a service built on httpserver: it serves on
// for its delay after SIGTERM, drains for drain, waits for the handlers of
// the calls the drain cut off (httpserver.CutOffWait), closes its pools
// (postgres.CloseWait at most each: two for a service with a database,
// its own and its side connection's), then flushes its last spans
// (telemetry.MaxFlushTime at most). One formula for the three services,
// so a step added to their stop is counted in every one.
func ServiceStop(delay, drain time.Duration, pools int) time.Duration {
	return delay + drain + httpserver.CutOffWait + time.Duration(pools)*postgres.CloseWait + telemetry.MaxFlushTime
}

// reads reports whether the binary reads name, itself or through the
// library of name's family.
func (b Binary[C]) reads(name string) bool {
	if slices.Contains(b.Read, name) {
		return true
	}
	f, ok := familyOf(name)
	return ok && f.readBy(b.Read)
}

// CheckTable holds the binary's own README table against what it reads:
// every variable read is in the table, every row is read, with the default
// and the requirement it says. It returns the problems found.
func (b Binary[C]) CheckTable(table []Setting) []string {
	var problems []string
	documented := map[string]bool{}
	for _, s := range table {
		documented[s.Name] = true
	}
	for _, name := range b.Read {
		if _, inFamily := familyOf(name); !documented[name] && !inFamily {
			problems = append(problems, fmt.Sprintf("%s reads %s, which its table lacks", b.Name, name))
		}
	}
	for _, f := range families {
		if f.readBy(b.Read) && !documented[f.entry] {
			problems = append(problems, fmt.Sprintf("%s reads the %s variables, which its table lacks", b.Name, f.entry))
		}
	}
	for _, s := range table {
		if !b.reads(s.Name) {
			problems = append(problems, fmt.Sprintf("line %d: %s is in the table, but %s does not read it", s.Line, s.Name, b.Name))
			continue
		}
		problems = append(problems, b.checkDefault(s)...)
	}
	return problems
}

// CheckRootTable holds the root README's table against the binary: a row
// that names it is read by it, with that default; a row that does not
// name it is not read by it.
func (b Binary[C]) CheckRootTable(table []Setting) []string {
	var problems []string
	for _, s := range table {
		listed := slices.Contains(s.Binaries, b.Name)
		switch {
		case listed && !b.reads(s.Name):
			problems = append(problems, fmt.Sprintf("line %d: the table says %s reads %s, but it does not", s.Line, b.Name, s.Name))
		case !listed && b.reads(s.Name):
			problems = append(problems, fmt.Sprintf("line %d: %s reads %s, but the table's binaries (%s) leave it out", s.Line, b.Name, s.Name, strings.Join(s.Binaries, ", ")))
		case listed:
			problems = append(problems, b.checkDefault(s)...)
		}
	}
	return problems
}

// CheckMisspellingHints holds the names the binary's start warns of
// misspellings of (Settings) to what it reads: each variable but a
// library's family's, as the root README promises.
func (b Binary[C]) CheckMisspellingHints() []string {
	cfg, err := b.Load(mapGetenv(b.Base))
	if err != nil {
		return []string{fmt.Sprintf("the base environment does not load: %v", err)}
	}
	var problems []string
	for _, name := range b.Read {
		if _, inFamily := familyOf(name); !inFamily && !slices.Contains(b.Settings(cfg), name) {
			problems = append(problems, fmt.Sprintf("%s reads %s, but its Config.Settings lacks it: a misspelling of it would be ignored without a warning", b.Name, name))
		}
	}
	return problems
}

// checkDefault loads the configuration with the setting unset, which must
// stop the loader if and only if the setting is documented as required,
// and with it set to its documented default, which must give the same
// Config. A default that names another variable (READ_DATABASE_URL's is
// DATABASE_URL) is that variable's value.
func (b Binary[C]) checkDefault(s Setting) []string {
	if _, ok := familyOf(s.Name); ok {
		return nil // a library's: no Config field holds them
	}
	unset := maps.Clone(b.Base)
	delete(unset, s.Name)
	if s.Required {
		if _, err := b.Load(mapGetenv(unset)); err == nil || !namesSetting(err, s.Name) {
			return []string{fmt.Sprintf("line %d: %s is documented as required, but %s unset loads (error %v)", s.Line, s.Name, s.Name, err)}
		}
		return nil
	}
	want, err := b.Load(mapGetenv(unset))
	if err != nil {
		return []string{fmt.Sprintf("line %d: %s unset is refused, but the table does not say it is required: %v", s.Line, s.Name, err)}
	}
	if s.Default == "" {
		return nil
	}
	value := s.Default
	if b.reads(value) {
		value = b.Base[value]
	}
	set := maps.Clone(unset)
	set[s.Name] = value
	got, err := b.Load(mapGetenv(set))
	if err != nil {
		return []string{fmt.Sprintf("line %d: %s=%s, its documented default, is refused: %v", s.Line, s.Name, s.Default, err)}
	}
	if diff := fieldDiff(want, got); diff != "" {
		return []string{fmt.Sprintf("line %d: %s's documented default %q is not the default in code: %s", s.Line, s.Name, s.Default, diff)}
	}
	return nil
}

// CheckEnv holds an environment made for this binary alone (a container's)
// against it: every variable is one it reads (or the Go runtime does), and
// the values load. It returns the Config they make and the problems.
func (b Binary[C]) CheckEnv(env map[string]string) (C, []string) {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if b.reads(name) || slices.Contains(runtimeVariables, name) {
			continue
		}
		p := fmt.Sprintf("sets %s, which %s does not read", name, b.Name)
		if m := envconfig.Misspelt([]string{name + "="}, b.Read); len(m) > 0 {
			p += fmt.Sprintf(" (did you mean %s?)", m[0].Meant)
		}
		problems = append(problems, p)
	}
	cfg, err := b.Load(mapGetenv(env))
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s refuses the values: %v", b.Name, err))
	}
	return cfg, problems
}

// CheckSharedEnv holds an environment that every binary gets (make run's)
// against this one: no variable is a misspelling of one it reads (no two
// settings of the binaries are that close: envconfig.Misspelt), and the
// values load.
func (b Binary[C]) CheckSharedEnv(env map[string]string) (C, []string) {
	var problems []string
	var environ []string
	for _, name := range slices.Sorted(maps.Keys(env)) {
		environ = append(environ, name+"=")
	}
	for _, m := range envconfig.Misspelt(environ, b.Read) {
		problems = append(problems, fmt.Sprintf("sets %s, which no binary reads: a misspelling of %s's %s?", m.Name, b.Name, m.Meant))
	}
	cfg, err := b.Load(mapGetenv(env))
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s refuses the values: %v", b.Name, err))
	}
	return cfg, problems
}

// CheckManifest holds the binary's container in a Kubernetes manifest
// against it: its environment (CheckEnv), its listeners reachable from
// other pods, the ports declared, probed, scraped, served by its Service
// and let in by its NetworkPolicies.
func (b Binary[C]) CheckManifest(m *Manifest) []string {
	c, ok := m.Containers[b.Name]
	if !ok {
		return []string{"no container named " + b.Name}
	}
	cfg, problems := b.CheckEnv(c.Env)
	if len(problems) > 0 {
		return problems
	}
	addr, admin := b.Listeners(cfg)
	problems = append(problems, notLoopback(addr, admin)...)
	problems = append(problems, b.checkContainerPorts(c, Port(addr), Port(admin))...)
	// Kubernetes counts the grace period from the pod's deletion: the
	// preStop hook's sleep is spent from it before SIGTERM.
	grace := "terminationGracePeriodSeconds"
	if c.PreStopSleep > 0 {
		grace = fmt.Sprintf("terminationGracePeriodSeconds less the %s preStop sleep", c.PreStopSleep)
	}
	problems = append(problems, b.checkGrace(grace, c.GracePeriod-c.PreStopSleep, cfg)...)
	return append(problems, b.checkService(m, Port(addr), Port(admin))...)
}

// checkGrace holds the time a pod or container is given between SIGTERM
// and SIGKILL to the binary's own stop: it must be longer, or requests
// still draining are cut off without the log line that says so, and the
// spans of the last requests are lost.
func (b Binary[C]) checkGrace(setting string, grace time.Duration, cfg C) []string {
	if b.Stop == nil {
		return nil
	}
	if stop := b.Stop(cfg); grace <= stop {
		return []string{fmt.Sprintf("%s is %s, but %s may take %s to stop after SIGTERM (it is killed while it drains)", setting, grace, b.Name, stop)}
	}
	return nil
}

// checkContainerPorts holds the ports a container declares, probes and
// has scraped to the ones the binary listens on: main serves HealthPath,
// admin the metrics.
func (b Binary[C]) checkContainerPorts(c Container, main, admin int) []string {
	var problems []string
	if got := slices.Sorted(slices.Values(c.Ports)); !slices.Equal(got, slices.Sorted(slices.Values([]int{main, admin}))) {
		problems = append(problems, fmt.Sprintf("containerPorts %v, but it listens on %d and %d", got, main, admin))
	}
	want := map[string]Probe{"readiness": {b.HealthPath, main}, "liveness": {metricsPath, admin}, "startup": {metricsPath, admin}}
	for _, kind := range slices.Sorted(maps.Keys(want)) {
		if got := c.Probes[kind]; got != want[kind] {
			problems = append(problems, fmt.Sprintf("%s probe GET %s on %d, want %s on %d", kind, got.Path, got.Port, want[kind].Path, want[kind].Port))
		}
	}
	if c.ScrapePort != fmt.Sprint(admin) {
		problems = append(problems, fmt.Sprintf("prometheus.io/port %q, but metrics are on %d", c.ScrapePort, admin))
	}
	return problems
}

// checkService holds the Service of the binary's pods, which must send to
// its main port, and its NetworkPolicies, which must let both ports in.
func (b Binary[C]) checkService(m *Manifest, main, admin int) []string {
	var problems []string
	svc, ok := m.Services[b.Name]
	if !ok || svc.App != b.Name {
		problems = append(problems, fmt.Sprintf("no Service %s selecting app %s", b.Name, b.Name))
	}
	for _, p := range svc.Ports {
		if p.Target != main {
			problems = append(problems, fmt.Sprintf("Service %s sends port %d to %d, but %s listens on %d", b.Name, p.Port, p.Target, b.Name, main))
		}
	}
	for _, port := range []int{main, admin} {
		if !slices.Contains(m.PolicyPorts[b.Name], port) {
			problems = append(problems, fmt.Sprintf("no NetworkPolicy lets port %d of %s in (it lets %v)", port, b.Name, m.PolicyPorts[b.Name]))
		}
	}
	return problems
}

// CheckCompose holds the binary's Compose service against it: its
// environment (CheckEnv), its listeners reachable from other containers,
// and any published port one it listens on.
func (b Binary[C]) CheckCompose(services map[string]ComposeService) []string {
	s, ok := services[b.Name]
	if !ok {
		return []string{"no service named " + b.Name}
	}
	cfg, problems := b.CheckEnv(s.Env)
	if len(problems) > 0 {
		return problems
	}
	addr, admin := b.Listeners(cfg)
	problems = append(problems, notLoopback(addr, admin)...)
	problems = append(problems, b.checkGrace("stop_grace_period", s.StopGrace, cfg)...)
	for _, p := range s.Ports {
		container := p[strings.LastIndex(p, ":")+1:]
		if container != fmt.Sprint(Port(addr)) && container != fmt.Sprint(Port(admin)) {
			problems = append(problems, fmt.Sprintf("publishes %s, but %s listens on %s and %s", p, b.Name, addr, admin))
		}
	}
	return problems
}

// notLoopback: in a container, a listener on loopback answers no one else.
func notLoopback(addrs ...string) []string {
	var problems []string
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			problems = append(problems, fmt.Sprintf("listens on %s: loopback, which no other container reaches", a))
		}
	}
	return problems
}

func mapGetenv(env map[string]string) func(string) string {
	return func(name string) string { return env[name] }
}

// namesSetting reports whether err names the setting as a word of its own:
// an error about CURSOR_SECRET_PREVIOUS does not name CURSOR_SECRET.
func namesSetting(err error, name string) bool {
	return regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).MatchString(err.Error())
}

// fieldDiff names the fields of two structs that differ, "" if none.
func fieldDiff(want, got any) string {
	w, g := reflect.ValueOf(want), reflect.ValueOf(got)
	if w.Kind() != reflect.Struct {
		if reflect.DeepEqual(want, got) {
			return ""
		}
		return fmt.Sprintf("unset gives %v, the default gives %v", want, got)
	}
	var diffs []string
	for i := range w.NumField() {
		if !w.Type().Field(i).IsExported() {
			continue // Interface would panic; DeepEqual below sees it
		}
		if !reflect.DeepEqual(w.Field(i).Interface(), g.Field(i).Interface()) {
			diffs = append(diffs, fmt.Sprintf("%s is %v unset, %v with the documented default", w.Type().Field(i).Name, w.Field(i).Interface(), g.Field(i).Interface()))
		}
	}
	if len(diffs) == 0 && !reflect.DeepEqual(want, got) {
		return "an unexported field differs between unset and the documented default"
	}
	return strings.Join(diffs, "; ")
}

// checkGatewayDrain holds the gateway's drain (GATEWAY_SHUTDOWN_TIMEOUT
// in gatewayEnv, else gatewayDefault) to the service's own, with the
// service's settings in env: a call the gateway relays runs as long as the
// service lets it, and where the gateway drains for less, a call still
// running when the gateway stops is cut off there, its client answered
// nothing, where the service would have answered it (a sale waiting on a
// locked row: "nothing was applied" at its statement timeout; a schema
// read of a slow shop: shop_timeout).
func (b Binary[C]) checkGatewayDrain(gatewayEnv, env map[string]string, gatewayDefault time.Duration) []string {
	if b.Drain == nil {
		return nil
	}
	cfg, err := b.Load(mapGetenv(env)) // what else env holds is the other checks'
	if err != nil {
		return []string{fmt.Sprintf("%s's settings: %v", b.Name, err)}
	}
	gatewayDrain := gatewayDefault
	if setting, ok := gatewayEnv["GATEWAY_SHUTDOWN_TIMEOUT"]; ok {
		d, err := time.ParseDuration(setting)
		if err != nil {
			return []string{fmt.Sprintf("GATEWAY_SHUTDOWN_TIMEOUT %q: %v", setting, err)}
		}
		gatewayDrain = d
	}
	if drain := b.Drain(cfg); gatewayDrain < drain {
		return []string{fmt.Sprintf("the gateway drains for %s (GATEWAY_SHUTDOWN_TIMEOUT), but a call it relays to %s may run %s after SIGTERM: raise GATEWAY_SHUTDOWN_TIMEOUT, and the gateway's grace period with it",
			gatewayDrain, b.Name, drain)}
	}
	return nil
}
