// Command exportctl is the administrator's tool: it migrates the schema,
// creates owners and platforms, issues and revokes API keys (a key's secret
// is printed once, at creation, and never again), and imports or seeds
// export items. It reads DATABASE_URL.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/schema"
	"github.com/coinexport/export/pkg/stopsignal"
)

const usage = `usage: exportctl [--json] COMMAND [flags]   (--json: print JSON; before or after the command)

  migrate
  owner create --name NAME
  owner list
  platform create --id PLATFORM_ID [--name NAME]
  platform list
  key create --owner OWNER_ID --scope SCOPE[,SCOPE] [--platform PLATFORM_ID] [--name NAME]
  key revoke KEY_ID|KEY|-   (-: read from standard input, out of ps and shell history; prompted at a terminal)
  key list --owner OWNER_ID
  items import --owner OWNER_ID --file PATH|- [--allow-empty]
  items seed --owner OWNER_ID --count N [--seed S]
  items restamp --owner OWNER_ID | --all-owners   (after a restore of the database)

Scopes: export:read, sales:write (sales:write needs --platform).
Environment: DATABASE_URL (required).`

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, errNoDatabaseURL) {
			err = envconfig.WithMisspelt(err, os.Environ(), []string{"DATABASE_URL"})
		}
		fmt.Fprintln(os.Stderr, "exportctl:", redactKeys(err.Error()))
		if errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("invalid usage")

// errNoDatabaseURL is run's error without a DATABASE_URL: main adds the
// name of a variable set that looks like it misspelt (envconfig).
var errNoDatabaseURL = errors.New("DATABASE_URL is not set")

// databaseURL reads DATABASE_URL as the services do: blank is unset (a
// blank one had pgx dial its default socket as the OS user), and a value
// that is no connection string is refused naming the variable, not quoted
// (it may hold a password).
func databaseURL(getenv func(string) string) (string, error) {
	dsn := strings.TrimSpace(getenv("DATABASE_URL"))
	if dsn == "" {
		return "", errNoDatabaseURL
	}
	if problem := postgres.DSNProblem(dsn); problem != "" {
		return "", errors.New("DATABASE_URL " + problem)
	}
	return dsn, nil
}

// keyLike matches a key's tag (in any case, '_' typed as '-' or ' ') and
// everything after it up to the closing quote of the %q that quotes it (an
// escaped quote, \", does not end it), or to the end of the message. Not
// up to a space: a key pasted with a space (or a quote) inside it is most
// of a secret on either side of the break ("cxr_ <43 characters>" printed
// all of them but the tag before), and its checksum lets anyone confirm a
// guess of the rest. ContainsKeyLike reads such a key as a key too.
var keyLike = regexp.MustCompile(`(?i)cx[raw][-_ ](?:[^"\\]|\\.)*`)

// letterRun is a run of the keys' alphabet, where a key without its tag
// is looked for (apikey.ContainsUntaggedKey).
var letterRun = regexp.MustCompile(`[0-9A-Za-z]{` + strconv.Itoa(apikey.Len-len(apikey.TagRead)) + `,}`)

// refuseKeys refuses the values of the named flags that hold an API key's
// secret (apikey.ContainsKeySecret: the key, without its tag, its checksum
// cut short): what they name (an owner's name, a platform's id and name, a
// key's label) is stored and printed in the clear, a platform id in every
// sale's answer and log line too, and a key is stored only as its hash.
func refuseKeys(fs *flag.FlagSet, names ...string) error {
	for _, name := range names {
		if apikey.ContainsKeySecret(fs.Lookup(name).Value.String()) {
			return fmt.Errorf("%w: --%s holds an API key, which is never stored in the clear: nothing created; revoke that key (exportctl key revoke -): it was typed on a command line", errUsage, name)
		}
	}
	return nil
}

// redactKeys hides every key in an error message before it is printed: an
// error quotes the argument it refuses, and an administrator may have given
// a key where an id belongs ("key list --owner cxr_…"). Spec 5: keys are
// never written to logs, and a terminal's output often ends in one.
func redactKeys(msg string) string {
	if !apikey.ContainsKeyLike(msg) {
		return msg
	}
	msg = keyLike.ReplaceAllString(msg, "[a key, not shown]")
	return letterRun.ReplaceAllStringFunc(msg, func(run string) string {
		if apikey.ContainsUntaggedKey(run) {
			return "[a key, not shown]"
		}
		return run
	})
}

// command is one "noun verb" of the CLI.
type command func(ctx context.Context, env *env, args []string) error

// env is what every command gets: the database and where to write. out
// is for what the command prints; notes, for a person at a terminal (a
// prompt, "no owners"), where a script reading out does not read them.
type env struct {
	pool  *pgxpool.Pool
	stdin io.Reader
	out   io.Writer
	notes io.Writer
}

var commands = map[string]command{
	"migrate":         migrate,
	"owner create":    ownerCreate,
	"owner list":      ownerList,
	"platform create": platformCreate,
	"platform list":   platformList,
	"key create":      keyCreate,
	"key revoke":      keyRevoke,
	"key list":        keyList,
	"items import":    itemsImport,
	"items seed":      itemsSeed,
	"items restamp":   itemsRestamp,
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if wantsHelp(args) {
		_, err := fmt.Fprintln(stdout, usage) // asked for: on stdout, and no error
		return err
	}
	name, rest, err := commandName(args)
	if err != nil {
		return err
	}
	dsn, err := databaseURL(getenv)
	if err != nil {
		return err
	}
	pool, err := postgres.Open(ctx, dsn, postgres.ApplicationName("exportctl"))
	if err != nil {
		return withCause(err)
	}
	defer postgres.Close(pool)
	err = commands[name](ctx, &env{pool: pool, stdin: stdin, out: stdout, notes: stderr}, rest)
	if name != "migrate" { // a migration failing on a missing table needs other advice than "run migrate"
		err = withMigrationsMissing(ctx, pool, dsn, err)
	}
	return withCause(err)
}

// withMigrationsMissing adds to a command's error, when PostgreSQL found
// no such table or column (42P01, 42703) and the database lacks this
// build's migrations, that it does, which database it is and what to run:
// on a new database, or with DATABASE_URL naming another database of the
// cluster (its "postgres"), every command printed only `relation "owners"
// does not exist`.
func withMigrationsMissing(ctx context.Context, pool *pgxpool.Pool, dsn string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" && pgErr.Code != "42703" || errors.Is(err, catalog.ErrStagingLost) {
		return err
	}
	database, build, versionErr := schema.Versions(ctx, pool)
	switch {
	case versionErr != nil || database >= build:
		return err
	case database == 0:
		return fmt.Errorf("%w: no migration has been applied to the database %s (DATABASE_URL leads to %s): run exportctl migrate, unless that is the wrong database",
			err, pool.Config().ConnConfig.Database, postgres.Describe(dsn))
	}
	return fmt.Errorf("%w: the database is at schema version %d, this exportctl needs %d: run exportctl migrate", err, database, build)
}

// withCause adds to err what PostgreSQL refused and what puts it right
// (postgres.Cause), as the services' log lines do: exportctl's operator is
// the one to act, and the server's words alone (a password refused, a disk
// full, SQLSTATE 53100) did not say where, nor that DATABASE_URL is the
// setting in question.
func withCause(err error) error {
	if cause := postgres.Cause(err); cause != "" {
		return fmt.Errorf("%w: %s", err, cause)
	}
	return err
}

// wantsHelp reports "exportctl help" (with a command after it or not,
// and a --json before it, as before any command), or -h or --help
// anywhere (before a "--"), as "exportctl key create -h": the usage is
// printed whatever else is given, and without a database.
func wantsHelp(args []string) bool {
	for len(args) >= 1 && isJSONFlag(args[0]) {
		args = args[1:]
	}
	if len(args) >= 1 && args[0] == "help" {
		return true
	}
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// commandName finds the command in args and returns its flags. A --json
// written before the command (as a global flag, "exportctl --json key
// list") is handed to the command like one written after it.
func commandName(args []string) (string, []string, error) {
	if len(args) >= 1 && isJSONFlag(args[0]) {
		name, rest, err := commandName(args[1:])
		return name, append([]string{args[0]}, rest...), err
	}
	if len(args) >= 1 && commands[args[0]] != nil {
		return args[0], args[1:], nil
	}
	if len(args) >= 2 && commands[args[0]+" "+args[1]] != nil {
		return args[0] + " " + args[1], args[2:], nil
	}
	if len(args) == 0 {
		return "", nil, fmt.Errorf("%w: no command given", errUsage)
	}
	return "", nil, fmt.Errorf("%w: unknown command %q", errUsage, strings.Join(args, " "))
}

// isJSONFlag reports --json in any of the flag package's spellings
// (-json, --json, --json=true, …).
func isJSONFlag(arg string) bool {
	name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-"), "=")
	return strings.HasPrefix(arg, "-") && name == "json"
}

// flags parses args, allowing positional arguments between flags, and
// returns the positional ones. A flag that takes a value takes one
// (onlyOnce).
func flags(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			f.Value = &onlyOnce{Value: f.Value, name: f.Name}
		}
	})
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// onlyOnce is a flag's value that refuses a second one: the flag package
// keeps the last, so "--scope export:read --scope sales:write" made a key
// without export:read, and "--owner A … --owner B" a key of B. A switch
// (--json) given twice says the same thing twice, and is left alone.
type onlyOnce struct {
	flag.Value
	name string
	set  bool
}

func (o *onlyOnce) Set(value string) error {
	if o.set && o.name == "scope" {
		return errors.New("--scope is given twice: it takes one value (join scopes with a comma)")
	}
	if o.set {
		return fmt.Errorf("--%s is given twice: it takes one value", o.name)
	}
	o.set = true
	return o.Value.Set(value)
}

// flagsOnly parses args for a command that takes flags only. A word
// outside a flag is refused, not dropped: "--name Acme Coins" would make an
// owner named "Acme", "--scope export:read sales:write" a key without
// sales:write, and "--file a.jsonl b.jsonl" import a.jsonl only.
func flagsOnly(fs *flag.FlagSet, args []string) error {
	positional, err := flags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return fmt.Errorf("%w: %s takes flags only, not %q (quote a value that holds spaces; join scopes with a comma)",
			errUsage, fs.Name(), positional[0])
	}
	return nil
}

// required reports the first of the flags names (in the usage's order)
// that fs parsed empty.
func required(fs *flag.FlagSet, names ...string) error {
	for _, name := range names {
		if fs.Lookup(name).Value.String() == "" {
			return fmt.Errorf("%w: --%s is required", errUsage, name)
		}
	}
	return nil
}

// note writes a line for a person (notes): a list of nothing says so
// there, and a script reading out still reads nothing. It is no output of
// the command's, so a failure to write it is no failure of the command.
func (e *env) note(line string) {
	_, _ = fmt.Fprintln(e.notes, line)
}

// emit prints v as JSON when asJSON, else the human line.
func emit(out io.Writer, asJSON bool, v any, human string) error {
	if !asJSON {
		_, err := fmt.Fprintln(out, human)
		return err
	}
	enc := json.NewEncoder(out)
	return enc.Encode(v)
}
