package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/coinexport/export/pkg/schema"
)

func migrate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := flags(fs, args); err != nil {
		return err
	}
	if err := schema.Migrate(ctx, e.pool, nil); err != nil {
		return err
	}
	return emit(e.out, *asJSON, map[string]string{"schema_version": schema.Version()}, "schema is up to date")
}

func ownerCreate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("owner create", flag.ContinueOnError)
	name := fs.String("name", "", "owner name")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := flags(fs, args); err != nil {
		return err
	}
	if err := required(map[string]string{"name": *name}); err != nil {
		return err
	}
	var id string
	err := e.pool.QueryRow(ctx, "INSERT INTO owners (name) VALUES ($1) RETURNING id::text", *name).Scan(&id)
	if err != nil {
		return fmt.Errorf("create owner: %w", err)
	}
	return emit(e.out, *asJSON, map[string]string{"id": id, "name": *name}, "owner "+id)
}

func platformCreate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("platform create", flag.ContinueOnError)
	id := fs.String("id", "", "platform id (letters, digits, . _ -)")
	name := fs.String("name", "", "platform name")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := flags(fs, args); err != nil {
		return err
	}
	if err := required(map[string]string{"id": *id}); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, "INSERT INTO platforms (id, name) VALUES ($1, $2)", *id, *name); err != nil {
		return fmt.Errorf("create platform: %w", err)
	}
	return emit(e.out, *asJSON, map[string]string{"id": *id, "name": *name}, "platform "+*id)
}
