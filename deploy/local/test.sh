#!/usr/bin/env bash
# make test: every test of every module against one throwaway PostgreSQL
# cluster and one redis-server, started here and removed on exit. Each test
# still gets a fresh database of its own (pkg/testenv).
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/local/lib.sh
ensure_packages

tmp=$(mktemp -d /tmp/export-test.XXXXXX)
chmod 755 "$tmp"
cleanup() { pg_stop "$tmp/pg"; redis_stop "$tmp/redis"; rm -rf "$tmp"; }
trap cleanup EXIT
PG_SHARED_BUFFERS=128MB PG_EXTRA_OPTS="-c fsync=off -c synchronous_commit=off -c full_page_writes=off" pg_start "$tmp/pg"
redis_start "$tmp/redis"
export TEST_DATABASE_URL="host=$tmp/pg user=postgres dbname=postgres sslmode=disable"
export TEST_REDIS_URL="unix://$tmp/redis/redis.sock"

status=0
for mod in $(go list -m -f '{{.Dir}}'); do
  log "go test $(realpath --relative-to=. "$mod")"
  # -timeout 30m: go's default of 10 minutes a package is under 4x the
  # slowest package's run here (pkg/stopsignal: 96 s, 167 s on one CPU),
  # and a package timeout ends with a goroutine dump, where the tests' own
  # bounds (stopsignal's stop, 335 s) would name what did not stop.
  (cd "$mod" && go test -count=1 -timeout 30m ${GOTEST_FLAGS:-} ./...) || status=1
done
# The alert rules are code too: promtool checks them and runs their unit
# tests (deploy/prometheus/alerts_test.yml). It comes with Debian's
# prometheus package (.ci/run installs it); without it the rules are
# skipped and said so, unless REQUIRE_PROMTOOL=1, which fails.
if command -v promtool >/dev/null 2>&1; then
  log "promtool test rules deploy/prometheus/alerts_test.yml"
  { promtool check rules deploy/prometheus/alerts.yml && promtool test rules deploy/prometheus/alerts_test.yml; } || status=1
elif [ "${REQUIRE_PROMTOOL:-0}" = 1 ]; then
  log "promtool not installed, and REQUIRE_PROMTOOL=1: the alert rules cannot be tested"
  status=1
else
  log "promtool not installed: the alert rules were not tested (apt-get install prometheus)"
fi
# Alertmanager's part of them (deploy/prometheus/alertmanager.yml, whose
# inhibit rules ops copy): amtool, from Debian's prometheus-alertmanager
# (.ci/run installs it), checks that it is a configuration Alertmanager
# loads; without it, skipped and said so.
if command -v amtool >/dev/null 2>&1; then
  log "amtool check-config deploy/prometheus/alertmanager.yml"
  amtool check-config deploy/prometheus/alertmanager.yml || status=1
else
  log "amtool not installed: deploy/prometheus/alertmanager.yml was not checked (apt-get install prometheus-alertmanager)"
fi
exit $status
