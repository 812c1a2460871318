package envdoc

import (
	"path/filepath"
	"testing"
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
}

// sampleSecret is a value as long as `openssl rand -base64 32` makes.
func sampleSecret(what string) string {
	return (what + "-sample-secret-0123456789abcdefghijklmnopqrstuvwxyz")[:44]
}

// Where the files are, from the repository's root.
const (
	ManifestFile  = "deploy/k8s/export-service.yaml"
	ComposeFile   = "docker-compose.yml"
	RunScriptFile = "deploy/local/run.sh"
)

// Test runs every check of the binary, one subtest per file: its own
// README's table (dir/README.md), the root README's, the Kubernetes
// manifest, the Compose file and make run's script; and one of the names
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
		env, err := ReadRunScript(filepath.Join(root, RunScriptFile), map[string]string{"state": "/home/dev/export/.run", "state_in_url": "/home/dev/export/.run"}, Secrets)
		if err != nil {
			t.Fatal(err)
		}
		_, problems := b.CheckSharedEnv(env)
		report(t, problems)
	})
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
