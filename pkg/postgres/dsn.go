package postgres

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WithPoolSize returns dsn with pool_max_conns set to size, in whichever of
// PostgreSQL's two connection-string forms dsn was given.
func WithPoolSize(dsn string, size int) string {
	n := strconv.Itoa(size)
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn // Open reports it, without quoting it
		}
		// The query is kept as written, pool_max_conns replaced: decoded
		// and encoded again (url.Values), a space came out as "+", which pgx
		// reads as a "+" (a socket folder "/my code" became "/my+code"),
		// and a "+" written raw, which pgx keeps, as a space.
		settings := []string{}
		for _, setting := range strings.Split(u.RawQuery, "&") {
			if key, _, _ := strings.Cut(setting, "="); setting != "" && key != "pool_max_conns" {
				settings = append(settings, setting)
			}
		}
		u.RawQuery = strings.Join(append(settings, "pool_max_conns="+n), "&")
		return u.String()
	}
	// In keyword/value form the last setting of a keyword wins.
	return dsn + " pool_max_conns=" + n
}

// Describe says where a connection string leads, for start-up logs: user,
// hosts and database as pgx reads them, and nothing else, so no password
// can show whichever way it was written (quoted, with spaces around "=", in
// a URL's user info or its query). Editing the string to hide the password
// missed the last three.
func Describe(dsn string) string {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return "(unparsable)" // not quoted: it may hold the password
	}
	cc := cfg.ConnConfig
	hosts := []string{hostPort(cc.Host, cc.Port)}
	for _, fb := range cc.Fallbacks {
		if hp := hostPort(fb.Host, fb.Port); hp != hosts[len(hosts)-1] {
			hosts = append(hosts, hp)
		}
	}
	// A URL with an unescaped "@" or "/" in its password parses, but
	// splits the password into the user or a host name.
	for _, part := range append(hosts, cc.User, cc.Database) {
		if strings.Contains(part, "@") || !strings.HasPrefix(part, "/") && strings.Contains(part, "/") {
			return "(unparsable)"
		}
	}
	return cc.User + "@" + strings.Join(hosts, ",") + "/" + cc.Database
}

// hostPort joins a TCP host and port; a Unix socket directory stays as it is.
func hostPort(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// DSNProblem says what is wrong with a connection string, "" when nothing
// is, for a binary's configuration to name the variable that holds a bad
// one: Open's own error cannot quote it (a password). A connection keyword
// written in capitals ("Host=db") is named, as written and as pgx reads
// it: told that key=value pairs are no connection string, an operator
// looked at key=value pairs. It quotes nothing else of the string (a
// misspelt URL scheme puts the password in what pgx reads as a keyword).
func DSNProblem(dsn string) string {
	if _, err := parseConfig(dsn); err == nil {
		return ""
	}
	if keyword := keywordInCapitals(dsn); keyword != "" {
		return fmt.Sprintf("writes the keyword %s, which PostgreSQL reads in lower case only (%s)", keyword, strings.ToLower(keyword))
	}
	return "must be a PostgreSQL connection string (a postgres:// URL or key=value pairs)"
}

// errInvalidDSN never quotes the DSN, which can hold a password.
var errInvalidDSN = errors.New("postgres: invalid connection string")

// parseConfig is pgxpool.ParseConfig refusing also what pgx would take for
// a setting of the session (a runtime parameter) but that no PostgreSQL
// setting could be: pgx reads a keyword it does not know as one. A URL
// whose scheme is misspelt ("postgress://user:pw@db/app?sslmode=require")
// reads as keyword/value pairs, its whole text before "=" a keyword, and a
// keyword in another letter case ("Host=db") is not a connection keyword:
// either way pgx then dialled its default host (the local socket,
// localhost), so a service waited there for ever ("PostgreSQL not
// reached"), and the mangled URL, password and all, went to whatever
// server answered there as a parameter name.
func parseConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errInvalidDSN // its error may quote the DSN
	}
	for name := range cfg.ConnConfig.RuntimeParams {
		if !settingName.MatchString(name) || slices.Contains(connectionKeywords, strings.ToLower(name)) {
			return nil, errInvalidDSN
		}
	}
	return cfg, nil
}

// keywordInCapitals is a connection keyword dsn writes in another letter
// case ("Host", "DBNAME"; the first in order when there are several), ""
// when it writes none or pgx cannot read it at all.
func keywordInCapitals(dsn string) string {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	var found []string
	for name := range cfg.ConnConfig.RuntimeParams {
		if slices.Contains(connectionKeywords, strings.ToLower(name)) {
			found = append(found, name)
		}
	}
	slices.Sort(found)
	if len(found) == 0 {
		return ""
	}
	return found[0]
}

// settingName is the form of a PostgreSQL setting's name: an identifier,
// or a custom one's prefix and identifier ("myapp.tenant").
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$`)

// connectionKeywords are keywords pgx reads in lower case only, which
// written otherwise become a parameter and leave their default in force.
var connectionKeywords = []string{"host", "hostaddr", "port", "dbname", "database", "user", "password",
	"sslmode", "connect_timeout", "target_session_attrs"}
