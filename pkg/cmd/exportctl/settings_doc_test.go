package main

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/envdoc"
	"github.com/coinexport/export/pkg/postgres"
)

// The migration job of the Kubernetes manifest and of the Compose file
// gives exportctl only what it reads, with values it accepts.
func TestMigrateJobsSetWhatExportctlReads(t *testing.T) {
	b := exportctlForDocs(t)
	root := "../../.."
	m, err := envdoc.ReadManifest(filepath.Join(root, envdoc.ManifestFile), envdoc.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	compose, err := envdoc.ReadCompose(filepath.Join(root, envdoc.ComposeFile), envdoc.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	for where, env := range map[string]map[string]string{
		envdoc.ManifestFile + ": Job export-migrate": m.Containers["migrate"].Env,
		envdoc.ComposeFile + ": service migrate":     compose["migrate"].Env,
	} {
		if len(env) == 0 {
			t.Errorf("%s: no migrate container, or no environment", where)
		}
		if _, problems := b.CheckEnv(env); len(problems) > 0 {
			t.Errorf("%s: %s", where, strings.Join(problems, "; "))
		}
	}
}

// exportctlForDocs learns what exportctl reads by running a command with a
// recording getenv and a context already done: it reads the database URL,
// then fails to connect.
func exportctlForDocs(t *testing.T) envdoc.Binary[struct{}] {
	rec := &envdoc.Recorder{Env: map[string]string{"DATABASE_URL": envdoc.Secrets["DATABASE_URL"]}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := run(ctx, []string{"migrate"}, rec.Getenv, strings.NewReader(""), io.Discard, io.Discard); err == nil {
		t.Fatal("exportctl migrate with a stopped context = nil, want an error")
	}
	return envdoc.Binary[struct{}]{
		Name: "exportctl",
		Load: func(getenv func(string) string) (struct{}, error) {
			if problem := postgres.DSNProblem(getenv("DATABASE_URL")); problem != "" {
				return struct{}{}, errors.New("DATABASE_URL " + problem)
			}
			return struct{}{}, nil
		},
		Read: rec.Names(),
	}
}
