package envdoc

import (
	"path/filepath"
	"testing"
	"time"
)

// Secrets are sample values of what an operator provides: the keys of the
// Kubernetes manifest's Secret and the variables Compose wants from the
// shell or a .env file. The optional ones are given too, so that the
// values they reach are checked.
var Secrets = map[string]string{
	"DATABASE_URL":             "postgres://export:password@primary:5432/export",
	"READ_DATABASE_URL":        "postgres://export:password@replica:5432/export",
	"REDIS_URL":                "redis://redis:6379/0",
	"IDENTITY_SECRET":          sampleSecret("identity"),
	"IDENTITY_SECRET_PREVIOUS": sampleSecret("identity-previous"),
	"CURSOR_SECRET":            sampleSecret("cursor"),
	"CURSOR_SECRET_PREVIOUS":   sampleSecret("cursor-previous"),
	// shop-schema's own identity secret: the gateway's
	// SHOP_SCHEMA_IDENTITY_SECRET, shop-schema's IDENTITY_SECRET.
	"SHOP_SCHEMA_IDENTITY_SECRET": sampleSecret("shop-schema-identity"),
}

// sampleSecret is a value as long as `openssl rand -base64 32` makes.
func sampleSecret(what string) string {
	return (what + "-sample-secret-0123456789abcdefghijklmnopqrstuvwxyz")[:44]
}

// runScriptVars are the shell variables make run's script sets before
// the environment it gives each binary: its state folder's path.
var runScriptVars = map[string]string{"state": "/home/dev/export/.run", "state_in_url": "/home/dev/export/.run"}

// Where the files are, from the repository's root.
const (
	ManifestFile  = "deploy/k8s/export-service.yaml"
	ComposeFile   = "docker-compose.yml"
	RunScriptFile = "deploy/local/run.sh"
)

// Test runs every check of the binary, one subtest per file: its own
// README's table (dir/README.md), the root README's, the Kubernetes
// manifest, the Compose file and make run's script (their environments
// and the time each gives the binary to stop); and one of the names
// its start warns of misspellings of. root is the
// repository's root and dir the binary's folder in it.
func (b Binary[C]) Test(t *testing.T, root, dir string) {
	t.Run(filepath.Join(dir, "README.md"), func(t *testing.T) {
		report(t, b.CheckTable(table(t, filepath.Join(root, dir, "README.md"))))
	})
	t.Run("README.md", func(t *testing.T) {
		report(t, b.CheckRootTable(table(t, filepath.Join(root, "README.md"))))
	})
	t.Run("misspelling hints", func(t *testing.T) {
		report(t, b.CheckMisspellingHints())
	})
	t.Run(ManifestFile, func(t *testing.T) {
		m, err := ReadManifest(filepath.Join(root, ManifestFile), Secrets)
		if err != nil {
			t.Fatal(err)
		}
		report(t, b.CheckManifest(m))
	})
	t.Run(ComposeFile, func(t *testing.T) {
		services, err := ReadCompose(filepath.Join(root, ComposeFile), Secrets)
		if err != nil {
			t.Fatal(err)
		}
		report(t, b.CheckCompose(services))
	})
	t.Run(RunScriptFile, func(t *testing.T) {
		env, err := ReadRunScript(filepath.Join(root, RunScriptFile), runScriptVars, Secrets)
		if err != nil {
			t.Fatal(err)
		}
		cfg, problems := b.CheckSharedEnv(env)
		if len(problems) == 0 {
			// The script kills a binary still there stop_grace after its
			// TERM, as a supervisor does past its grace period.
			grace, err := ReadRunScriptStopGrace(filepath.Join(root, RunScriptFile))
			if err != nil {
				t.Fatal(err)
			}
			problems = b.checkGrace("stop_grace", grace, cfg)
		}
		report(t, problems)
	})
	if b.Drain != nil {
		t.Run("the gateway's drain", func(t *testing.T) { b.testGatewayDrain(t, root) })
	}
}

// testGatewayDrain holds, in each deployment, the gateway's drain to the
// binary's (checkGatewayDrain), the gateway's default read from its
// README's table (the gateway's own test holds that to its code).
func (b Binary[C]) testGatewayDrain(t *testing.T, root string) {
	var gatewayDefault time.Duration
	for _, s := range table(t, filepath.Join(root, "gateway", "README.md")) {
		if s.Name == "GATEWAY_SHUTDOWN_TIMEOUT" {
			d, err := time.ParseDuration(s.Default)
			if err != nil {
				t.Fatalf("gateway/README.md's default of GATEWAY_SHUTDOWN_TIMEOUT %q: %v", s.Default, err)
			}
			gatewayDefault = d
		}
	}
	if gatewayDefault == 0 {
		t.Fatal("gateway/README.md's table gives no default for GATEWAY_SHUTDOWN_TIMEOUT")
	}
	m, err := ReadManifest(filepath.Join(root, ManifestFile), Secrets)
	if err != nil {
		t.Fatal(err)
	}
	report(t, prefixed(ManifestFile, b.checkGatewayDrain(m.Containers["gateway"].Env, m.Containers[b.Name].Env, gatewayDefault)))
	services, err := ReadCompose(filepath.Join(root, ComposeFile), Secrets)
	if err != nil {
		t.Fatal(err)
	}
	report(t, prefixed(ComposeFile, b.checkGatewayDrain(services["gateway"].Env, services[b.Name].Env, gatewayDefault)))
	env, err := ReadRunScript(filepath.Join(root, RunScriptFile), runScriptVars, Secrets)
	if err != nil {
		t.Fatal(err)
	}
	report(t, prefixed(RunScriptFile, b.checkGatewayDrain(env, env, gatewayDefault)))
}

// prefixed is problems, each said of file.
func prefixed(file string, problems []string) []string {
	out := make([]string, len(problems))
	for i, p := range problems {
		out[i] = file + ": " + p
	}
	return out
}

func table(t *testing.T, path string) []Setting {
	t.Helper()
	settings, err := ReadTable(path)
	if err != nil {
		t.Fatal(err)
	}
	return settings
}

func report(t *testing.T, problems []string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
}
