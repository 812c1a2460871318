#!/usr/bin/env bash
# make run: the whole stack natively on this machine. PostgreSQL and Redis
# live under .run/ (kept between runs), binaries come from bin/ (make build).
# Stays in the foreground; Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
. deploy/local/lib.sh
ensure_packages

state=$root/.run
mkdir -p "$state/logs"
chmod 755 "$state"

# Secrets are made once per .run/ so cursors and signatures survive restarts.
if [ ! -f "$state/secrets" ]; then
  umask 077
  { echo "IDENTITY_SECRET=$(random_secret)"; echo "CURSOR_SECRET=$(random_secret)"; } >"$state/secrets"
  umask 022
fi
# They fill in only what the environment leaves unset: a secret given to
# make run (CURSOR_SECRET with CURSOR_SECRET_PREVIOUS, to try a rotation)
# wins, as every other setting does.
# The file is NAME=value lines, as this script writes it (not sourced: no
# quotes, no export).
while IFS= read -r line || [ -n "$line" ]; do
  name=${line%%=*}
  [[ $line == *=* && $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die ".run/secrets: a line is not NAME=value"
  [ -n "${!name:-}" ] || export "$name=${line#*=}"
done <"$state/secrets"

pids=()
declare -A names # pid → name, to say which process exited
stopping=
# stop_one PID: TERM, then wait; a process still there after stop_grace
# (longer than any binary's own drain, 10 s) is killed, so that Ctrl-C always
# ends make run (once, under heavy load, tracestore was seen to outlive its
# TERM and make run waited for ever).
stop_grace=20
stop_one() {
  local pid=$1 t state
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((t = 0; t < stop_grace * 10; t++)); do
    # Gone, or exited and not yet reaped (a zombie): stopped.
    { read -r _ _ state _ <"/proc/$pid/stat"; } 2>/dev/null || break
    [ "$state" != Z ] || break
    sleep 0.1
  done
  if [ "$t" -ge $((stop_grace * 10)) ]; then
    log "${names[$pid]:-pid $pid} did not stop within ${stop_grace}s of TERM: killed"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  trap - INT TERM EXIT
  stopping=1
  log "stopping"
  # Newest first, one at a time: the gateway drains while the services still
  # answer, and tracestore, started first, stops last, so the spans the others
  # flush as they stop are kept (stopped together, their last batch was lost).
  # After a Ctrl-C the others are stopping already: the terminal signalled
  # them; not tracestore, which has a session of its own.
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    stop_one "${pids[i]}"
  done
  redis_stop "$state/redis"
  pg_stop "$state/pg"
  log "stopped"
}
trap stop_all INT TERM EXIT

log "starting PostgreSQL and Redis under .run/"
pg_start "$state/pg"
redis_start "$state/redis"
pg_create_db "$state/pg" exportsvc

# Settings: anything already in the environment wins.
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@/exportsvc?host=$state/pg}"
export REDIS_URL="${REDIS_URL:-unix://$state/redis/redis.sock}"
export GATEWAY_ADDR="${GATEWAY_ADDR:-127.0.0.1:8080}"
export EXPORT_READER_ADDR="${EXPORT_READER_ADDR:-127.0.0.1:8081}"
export SALES_WRITER_ADDR="${SALES_WRITER_ADDR:-127.0.0.1:8082}"
export SHOP_SCHEMA_ADDR="${SHOP_SCHEMA_ADDR:-127.0.0.1:8083}"
export EXPORT_READER_URLS="${EXPORT_READER_URLS:-http://$EXPORT_READER_ADDR}"
export SALES_WRITER_URLS="${SALES_WRITER_URLS:-http://$SALES_WRITER_ADDR}"
export SHOP_SCHEMA_URLS="${SHOP_SCHEMA_URLS:-http://$SHOP_SCHEMA_ADDR}"
export BASE_URL="http://$GATEWAY_ADDR/v1"

log "migrating"
bin/exportctl migrate >/dev/null

demo=$state/demo.env
if [ ! -f "$demo" ]; then
  log "creating demo owner, platform, 1,000 items and two keys"
  owner=$(bin/exportctl owner create --name "Demo coins" --json | json_field id)
  bin/exportctl platform create --id demo-market --name "Demo marketplace" >/dev/null
  bin/exportctl items seed --owner "$owner" --count 1000 --seed 1 >/dev/null
  read_key=$(bin/exportctl key create --owner "$owner" --scope export:read --name demo-read --json | json_field key)
  write_key=$(bin/exportctl key create --owner "$owner" --scope sales:write --platform demo-market --name demo-write --json | json_field key)
  umask 077
  printf 'DEMO_OWNER_ID=%s\nDEMO_READ_KEY=%s\nDEMO_WRITE_KEY=%s\n' "$owner" "$read_key" "$write_key" >"$demo"
  umask 022
fi

# Exported, so that `. .run/env` serves exportctl and any other child; each
# value single-quoted (a quote inside written '\''), which POSIX shells read
# alike; readable by you only, as a DATABASE_URL given may hold a password.
shell_quote() { local q="'\\''"; printf "'%s'" "${1//\'/$q}"; }
umask 077
{
  echo "export DATABASE_URL=$(shell_quote "$DATABASE_URL")"
  echo "export REDIS_URL=$(shell_quote "$REDIS_URL")"
  echo "export BASE_URL=$(shell_quote "$BASE_URL")"
} >"$state/env"
umask 022

start() { # start NAME: runs bin/NAME in the background, logging to .run/logs
  local name=$1
  [ -x "bin/$name" ] || { log "bin/$name not built: skipped"; return 0; }
  "bin/$name" >>"$state/logs/$name.log" 2>&1 &
  pids+=($!); names[$!]=$name
  log "$name started (pid $!, log .run/logs/$name.log)"
}
# Local trace view: every binary exports its spans to tracestore, which
# appends them to .run/traces.jsonl (make trace ID=<request_id> prints one).
# An OTEL_EXPORTER_OTLP_ENDPOINT already set (Jaeger, Tempo, a collector) wins.
# It runs in a session of its own, like PostgreSQL and Redis: Ctrl-C signals
# the terminal's whole process group at once, and tracestore must outlive
# the others to receive the spans they flush as they stop (stop_all stops it
# last).
if [ -z "${OTEL_EXPORTER_OTLP_ENDPOINT:-}" ]; then
  $(command -v setsid || true) "bin/tracestore" serve --addr "${TRACESTORE_ADDR:-127.0.0.1:4318}" --file "$state/traces.jsonl" >>"$state/logs/tracestore.log" 2>&1 &
  pids+=($!); names[$!]=tracestore
  export OTEL_EXPORTER_OTLP_ENDPOINT="http://${TRACESTORE_ADDR:-127.0.0.1:4318}"
  export OTEL_BSP_SCHEDULE_DELAY="${OTEL_BSP_SCHEDULE_DELAY:-500}"
fi
for svc in export-reader sales-writer shop-schema; do start "$svc"; done
# The gateway starts once the services answer: its first health probe would
# otherwise find one still starting and report it down for a few seconds.
for addr in "$EXPORT_READER_ADDR" "$SALES_WRITER_ADDR" "$SHOP_SCHEMA_ADDR"; do
  for i in $(seq 100); do
    curl -fsS "http://$addr/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "http://$addr/healthz" >/dev/null 2>&1 || log "the service on $addr is not answering yet: see .run/logs/"
done
start gateway

for i in $(seq 100); do
  curl -fsS "$BASE_URL/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "$BASE_URL/health" >/dev/null 2>&1 || log "gateway is not answering yet: see .run/logs/gateway.log"

cat <<MSG

  Stack is up.  Base URL: $BASE_URL
  Demo keys: .run/demo.env (readable by you only; keys stay out of this output,
  which may end up in a log): DEMO_READ_KEY (export:read),
  DEMO_WRITE_KEY (sales:write, platform demo-market)
  Settings for scripts: .run/env     Logs: .run/logs/
  Traces: make trace ID=<meta.request_id>   (spans in .run/traces.jsonl)

  . .run/env; . .run/demo.env
  curl -s -H "X-API-Key: \$DEMO_READ_KEY" "\$BASE_URL/export/items?limit=2"

  Ctrl-C stops everything.
MSG

# Stay in the foreground until a process dies or the user presses Ctrl-C.
exited= status=0
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501 )); then
  wait -n -p exited "${pids[@]}" || status=$?
else # wait -p is bash 5.1's: without it, which process exited is not known
  wait -n "${pids[@]}" || status=$?
fi
name=${exited:+${names[$exited]:-}}
# Ctrl-C reaches every process at once, and one may end (status 0) before
# our own trap runs; bash then drops the SIGINT (the child handled it), so
# the trap never runs and a Ctrl-C cannot be told from a kill of that one
# process. The binaries end with status 0 only when signalled: the line says
# so, a stop and not a crash.
if [ -z "$stopping" ] && [ "$status" = 0 ]; then
  log "${name:-a process} stopped on a signal (Ctrl-C, or a kill); stopping the rest"
elif [ -z "$stopping" ]; then
  log "${name:-a process} exited (status $status): see .run/logs/${name:+$name.log} (stopping the rest)"
fi
