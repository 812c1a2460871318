package envdoc

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ComposeService is what a Compose file gives one service.
type ComposeService struct {
	Env   map[string]string // interpolated
	Ports []string          // as written: [host:]port:containerPort
	// StopGrace is stop_grace_period (Compose's default, 10 s, when left
	// out): SIGTERM to SIGKILL on docker compose stop, down or a recreate.
	StopGrace time.Duration
}

// defaultStopGrace is Compose's stop_grace_period when a service leaves it
// out.
const defaultStopGrace = 10 * time.Second

// ReadCompose reads a Compose file's services, their environments
// interpolated from vars (the shell's or the .env file's variables: a
// ${NAME:?…} that vars lacks is an error, as it stops Compose).
func ReadCompose(path string, vars map[string]string) (map[string]ComposeService, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Services map[string]struct {
			Environment     map[string]string
			Ports           []string
			StopGracePeriod string `yaml:"stop_grace_period"`
		}
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]ComposeService{}
	for name, s := range file.Services {
		svc := ComposeService{Env: map[string]string{}, Ports: s.Ports, StopGrace: defaultStopGrace}
		if s.StopGracePeriod != "" {
			// Compose's durations are Go's (10s, 1m30s).
			if svc.StopGrace, err = time.ParseDuration(s.StopGracePeriod); err != nil {
				return nil, fmt.Errorf("%s: service %s: stop_grace_period: %w", path, name, err)
			}
		}
		for k, v := range s.Environment {
			if svc.Env[k], err = expand(v, vars); err != nil {
				return nil, fmt.Errorf("%s: service %s: %s: %w", path, name, k, err)
			}
		}
		out[name] = svc
	}
	return out, nil
}

var (
	exportLine = regexp.MustCompile(`^\s*export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	secretLine = regexp.MustCompile(`echo "([A-Z_][A-Z0-9_]*)=\$\(random_secret\)"`)
	// reachableCall is run.sh's $(reachable "ADDR"), read as reachable reads it.
	reachableCall = regexp.MustCompile(`\$\(reachable "([^"]*)"\)`)
	// stopGraceLine is run.sh's setting of stop_grace, RUN_STOP_GRACE's
	// default, at the start of a line (not a comment's mention).
	stopGraceLine = regexp.MustCompile(`^stop_grace=\$\{RUN_STOP_GRACE:-([0-9]+)\}$`)
)

// ReadRunScriptStopGrace reads the time make run's script
// (deploy/local/run.sh) gives each binary from its TERM to its KILL: the
// script's stop_grace, in seconds, as it is when RUN_STOP_GRACE is unset.
func ReadRunScriptStopGrace(path string) (time.Duration, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for n, line := range strings.Split(string(raw), "\n") {
		if m := stopGraceLine.FindStringSubmatch(line); m != nil {
			seconds, err := strconv.Atoi(m[1])
			if err != nil {
				return 0, fmt.Errorf("%s:%d: stop_grace: %w", path, n+1, err)
			}
			return time.Duration(seconds) * time.Second, nil
		}
	}
	return 0, fmt.Errorf("%s: no stop_grace=${RUN_STOP_GRACE:-SECONDS} line", path)
}

// reachable is run.sh's function of that name: where a client on the
// machine reaches a listener on addr, on loopback for a listener on every
// address (":8080", "0.0.0.0:8080", "[::]:8080").
func reachable(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return addr
	}
	host := addr[:i]
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "[::]":
		host = "[::1]"
	}
	return host + addr[i:]
}

// expandReachable replaces each $(reachable "ADDR") of value with its
// result, ADDR expanded with vars.
func expandReachable(value string, vars map[string]string) (string, error) {
	var failed error
	out := reachableCall.ReplaceAllStringFunc(value, func(call string) string {
		addr, err := expand(reachableCall.FindStringSubmatch(call)[1], vars)
		if err != nil {
			failed = err
		}
		return reachable(addr)
	})
	return out, failed
}

// ReadRunScript returns the environment make run's script
// (deploy/local/run.sh) gives every binary it starts: each `export
// NAME=value` line, expanded in order with the shell variables in vars
// (such as state and state_in_url), and each secret it writes to .run/secrets with
// `echo "NAME=$(random_secret)"`, set to secrets[NAME] (a secret of its
// own each, as random_secret makes). Lines export in the script's order
// whatever branch they are in: each binary must accept all. The one
// command substitution read is the script's $(reachable "ADDR").
func ReadRunScript(path string, vars map[string]string, secrets map[string]string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	known := map[string]string{} // the shell's variables, then the exports so far
	maps.Copy(known, vars)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		for _, m := range secretLine.FindAllStringSubmatch(line, -1) {
			env[m[1]], known[m[1]] = secrets[m[1]], secrets[m[1]]
		}
		m := exportLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		value, err := expandReachable(strings.TrimSuffix(strings.TrimPrefix(m[2], `"`), `"`), known)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if env[m[1]], err = expand(value, known); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		known[m[1]] = env[m[1]]
	}
	return env, sc.Err()
}
