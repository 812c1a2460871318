#!/usr/bin/env bash
# make drill: the sale state machine checked as a history under
# faults. Starts a stack of its own (PostgreSQL, Redis, export-reader,
# sales-writer, gateway) under SALESDRILL_DIR on SALESDRILL_PORT and the
# ports after it, runs bin/salesdrill's concurrent clients through the
# gateway for SALESDRILL_DURATION seconds while it kills and restarts the
# processes in turn, then lets salesdrill settle and check the history
# (services/sales-writer/README.md, "Checked as a history under faults").
# Everything listens on loopback only; everything it started is stopped at
# the end. Exit status: salesdrill's (1 on a violation).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
. deploy/local/lib.sh
ensure_packages

drill_dir=${SALESDRILL_DIR:-$root/.run/salesdrill}
port=${SALESDRILL_PORT:-8180}        # gateway; +1 export-reader, +2 sales-writer, +4 a second one, +10..+14 their admin listeners
# seconds of calls under faults: at 60, the first nine faults (36 s of
# pauses between them, 15 s of pg-freeze, a few seconds each to restart)
# took the whole run, and writer-freeze (35 s) never came; 150 runs each
# fault once, writer-freeze ending about 140 s in (at 120, since
# pg-deadlock and pg-locks-full, its last 14 s came after the calls).
duration=${SALESDRILL_DURATION:-150}
every=${SALESDRILL_FAULT_EVERY:-4}   # seconds between two faults
# pg-deadlock first: only a call that changes an item can be in its
# cycle, and the first seconds have the most (before salescheck's clients
# stopped taking a replay for a sale, none executed after the first 40 s,
# and at its place after pg-read-only it met no call to deadlock, twice).
faults=${SALESDRILL_FAULTS:-pg-deadlock writer-kill pg-immediate gateway-restart pg-fast redis-stop pg-cancel writer-restart gateway-kill pg-read-only pg-locks-full pg-freeze writer-kill-pg-down writer-freeze}
items=${SALESDRILL_ITEMS:-6}

rm -rf "$drill_dir"
mkdir -p "$drill_dir/logs"
chmod 755 "$drill_dir"

log "building"
mkdir -p bin
for m in gateway services/export-reader services/sales-writer; do go build -o "bin/$(basename $m)" "./$m"; done
go build -o bin/exportctl ./pkg/cmd/exportctl
go build -o bin/salesdrill ./services/sales-writer/cmd/salesdrill

# drill_dir and drill_pid, not dir and pid: the EXIT trap runs in the scope
# of the function the script ends in (a die within lib.sh's pg_start, whose
# local is dir), and a local of the name would hide the global from
# stop_all, which would then stop nothing (TestScriptLocalsHideNothingTheirStopReads).
declare -A drill_pid=()
stop_all() {
  set +e
  local name
  for name in gateway sales-writer sales-writer-2 export-reader; do
    [ -n "${drill_pid[$name]:-}" ] && kill -CONT "${drill_pid[$name]}" 2>/dev/null
    [ -n "${drill_pid[$name]:-}" ] && kill -TERM "${drill_pid[$name]}" 2>/dev/null && wait "${drill_pid[$name]}" 2>/dev/null
  done
  [ -f "$drill_dir/pg/data/postmaster.pid" ] && pg_signal CONT
  redis_stop "$drill_dir/redis"
  pg_stop "$drill_dir/pg"
}
trap stop_all EXIT

pg_start "$drill_dir/pg"
redis_start "$drill_dir/redis"
pg_create_db "$drill_dir/pg" drill
export DATABASE_URL="postgres://postgres@/drill?host=$(url_path "$drill_dir/pg")"
export REDIS_URL="unix://$(url_path "$drill_dir")/redis/redis.sock"
export IDENTITY_SECRET=$(random_secret) CURSOR_SECRET=$(random_secret)
# No shop-schema runs (below), but the gateway signs for one with a secret
# of its own, as deployed.
export SHOP_SCHEMA_IDENTITY_SECRET=$(random_secret)
export GATEWAY_ADDR=127.0.0.1:$port GATEWAY_ADMIN_ADDR=127.0.0.1:$((port + 10))
export EXPORT_READER_ADDR=127.0.0.1:$((port + 1)) EXPORT_READER_ADMIN_ADDR=127.0.0.1:$((port + 11))
export SALES_WRITER_ADDR=127.0.0.1:$((port + 2)) SALES_WRITER_ADMIN_ADDR=127.0.0.1:$((port + 12))
export EXPORT_READER_URLS=http://$EXPORT_READER_ADDR SALES_WRITER_URLS=http://$SALES_WRITER_ADDR,http://127.0.0.1:$((port + 4))
# No shop-schema: its URL names a port of the range that nothing opens.
export SHOP_SCHEMA_URLS=http://127.0.0.1:$((port + 3))
# The clients send far more than a key's default limits allow.
export RATE_LIMIT_SALES_WRITE=1000000-M RATE_LIMIT_EXPORT_READ=1000000-M RATE_LIMIT_OWNER_IN_FLIGHT=0

log "migrating and seeding"
bin/exportctl migrate >/dev/null
owner=$(bin/exportctl owner create --name "Sales drill" --json | json_field id)
bin/exportctl items seed --owner "$owner" --count $((items * 3)) --seed 7 >/dev/null
umask 077
keys=$drill_dir/keys
: >"$keys"
for p in drill-a drill-b drill-c; do
  bin/exportctl platform create --id "$p" >/dev/null
  echo "$p=$(bin/exportctl key create --owner "$owner" --scope sales:write --platform "$p" --json | json_field key)" >>"$keys"
done
echo "read=$(bin/exportctl key create --owner "$owner" --scope export:read --json | json_field key)" >>"$keys"
umask 022
item_ids=$(psql -h "$drill_dir/pg" -U postgres -d drill -tAc \
  "SELECT string_agg(id, ',') FROM (SELECT id FROM export_items WHERE owner_id = '$owner' AND status = 'active' ORDER BY id LIMIT $items) AS i")

start() { # start NAME: sales-writer-2 is a second sales-writer, on port + 4
  case $1 in
    sales-writer-2) SALES_WRITER_ADDR=127.0.0.1:$((port + 4)) SALES_WRITER_ADMIN_ADDR=127.0.0.1:$((port + 14)) bin/sales-writer >>"$drill_dir/logs/$1.log" 2>&1 & ;;
    *) "bin/$1" >>"$drill_dir/logs/$1.log" 2>&1 & ;;
  esac
  drill_pid[$1]=$!
}
healthy() { # healthy URL: waits up to 10 s for a 200
  local i
  for i in $(seq 100); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "no 200 from $1 within 10 s"
}
start export-reader
start sales-writer
start sales-writer-2
healthy "http://$EXPORT_READER_ADDR/healthz"
healthy "http://$SALES_WRITER_ADDR/healthz"
healthy "http://127.0.0.1:$((port + 4))/healthz"
start gateway
healthy "http://$GATEWAY_ADDR/v1/health"

log "salesdrill for ${duration}s on $item_ids, a fault every ${every}s: $faults"
bin/salesdrill -base "http://$GATEWAY_ADDR/v1" -keys "$keys" -database "$DATABASE_URL" -owner "$owner" \
  -items "$item_ids" -duration "${duration}s" -retention "${IDEMPOTENCY_RETENTION:-24h}" -report "$drill_dir/history.html" -history "$drill_dir/history.jsonl" ${SALESDRILL_ARGS:-} &
drill=$!

pg_bin=$(pg_bin_dir)
pg_signal() { # pg_signal SIG: the postmaster of $drill_dir/pg and its children
  local main
  main=$(head -1 "$drill_dir/pg/data/postmaster.pid")
  kill -"$1" "$main" $(pgrep -P "$main") 2>/dev/null || true
}
pg_sql() { # pg_sql SQL: runs SQL in the drill's database, as its superuser
  psql -h "$drill_dir/pg" -U postgres -d drill -qtAc "$1" >/dev/null 2>>"$drill_dir/logs/psql.log" || log "fault: $1 failed"
}
fault() { # fault NAME: one fault, the stack whole again once it returns
  case $1 in
    writer-kill) kill -KILL "${drill_pid[sales-writer]}" || true; wait "${drill_pid[sales-writer]}" 2>/dev/null || true; sleep 0.5; start sales-writer ;;
    writer-restart) kill -TERM "${drill_pid[sales-writer]}" || true; wait "${drill_pid[sales-writer]}" 2>/dev/null || true; start sales-writer ;;
    gateway-kill) kill -KILL "${drill_pid[gateway]}" || true; wait "${drill_pid[gateway]}" 2>/dev/null || true; sleep 0.5; start gateway ;;
    gateway-restart) kill -TERM "${drill_pid[gateway]}" || true; wait "${drill_pid[gateway]}" 2>/dev/null || true; start gateway ;;
    pg-immediate | pg-fast)
      as_pg_user "$pg_bin/pg_ctl" -D "$drill_dir/pg/data" -m "${1#pg-}" -w stop >>"$drill_dir/pg/stop.log" 2>&1
      sleep 1
      pg_start "$drill_dir/pg" ;;
    redis-stop) redis_stop "$drill_dir/redis"; sleep 3; redis_start "$drill_dir/redis" ;;
    pg-cancel) # every statement of the writers cancelled (pg_cancel_backend), every millisecond for 3 s:
      # ERRORs that say nothing was applied, and cancels that race a commit
      pg_sql "DO \$\$ DECLARE stop timestamptz := clock_timestamp() + interval '3 s'; BEGIN
        WHILE clock_timestamp() < stop LOOP
          PERFORM pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'sales-writer';
          PERFORM pg_sleep(0.001);
        END LOOP; END \$\$" ;;
    pg-read-only) # the server read-only for 3 s (default_transaction_read_only, as a fenced primary):
      # sales fail 25006 until the writers' readiness takes them out
      pg_sql "ALTER SYSTEM SET default_transaction_read_only = on"; pg_sql "SELECT pg_reload_conf()"; sleep 3
      pg_sql "ALTER SYSTEM RESET default_transaction_read_only"; pg_sql "SELECT pg_reload_conf()" ;;
    pg-deadlock) # deadlocks for 6 s: the drill's items locked (FOR UPDATE), and once a writer waits
      # for one, the owner's sync lock asked for exclusively, which the waiting writers hold shared
      # (catalog.WriterLock), again and again: each writer in that cycle is the first to run its
      # deadlock check (deadlock_timeout, 50 ms for the fault's length, so that a call's 3 runs can
      # all meet one; the fault's own is a minute) and is rolled back, 40P01, an ERROR; a call whose
      # every run is rolled back so answers 503 "nothing was applied". Only a call that would change
      # an item waits for its lock (a confirm of a sold item does not), a few a second in a drill
      pg_sql "ALTER SYSTEM SET deadlock_timeout = '50ms'"; pg_sql "SELECT pg_reload_conf()"
      pg_sql "DO \$\$ DECLARE stop timestamptz := clock_timestamp() + interval '6 s'; BEGIN
        PERFORM set_config('deadlock_timeout', '1min', false); PERFORM set_config('lock_timeout', '15s', false);
        WHILE clock_timestamp() < stop LOOP
          PERFORM 1 FROM export_items WHERE owner_id = '$owner' FOR UPDATE;
          FOR i IN 1..200 LOOP
            EXIT WHEN EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'sales-writer' AND pg_backend_pid() = ANY(pg_blocking_pids(pid)));
            PERFORM pg_sleep(0.005);
          END LOOP;
          PERFORM pg_advisory_xact_lock(1868789363, hashtext('$owner'::uuid::text));
          COMMIT;
        END LOOP; END \$\$"
      pg_sql "ALTER SYSTEM RESET deadlock_timeout"; pg_sql "SELECT pg_reload_conf()" ;;
    pg-locks-full) # the server's lock table full for 3 s (class 53): a session takes advisory locks until
      # PostgreSQL refuses one "out of shared memory" (53200), and holds them; a sale, whose key's
      # lock needs an entry of that table, is refused 53200, an ERROR, and a new connection too (FATAL);
      # its locks are of a class of their own (1718379891), apart from the writers' and the sync lock
      pg_sql "DO \$\$ BEGIN
        FOR i IN 0..999 LOOP
          BEGIN
            PERFORM pg_advisory_lock(1718379891, n) FROM generate_series(i * 1000, i * 1000 + 999) AS n;
          EXCEPTION WHEN out_of_memory THEN EXIT;
          END;
        END LOOP;
        PERFORM pg_sleep(3); END \$\$" ;;
    pg-freeze) # every PostgreSQL process stopped for 15 s: statements hang past the writers' timeouts
      pg_signal STOP; sleep 15; pg_signal CONT ;;
    writer-kill-pg-down) # a writer starts while PostgreSQL is down
      as_pg_user "$pg_bin/pg_ctl" -D "$drill_dir/pg/data" -m fast -w stop >>"$drill_dir/pg/stop.log" 2>&1
      kill -KILL "${drill_pid[sales-writer]}" || true; wait "${drill_pid[sales-writer]}" 2>/dev/null || true
      start sales-writer; sleep 3; pg_start "$drill_dir/pg" ;;
    writer-freeze) # a writer stopped past the gateway's UPSTREAM_READ_TIMEOUT (30 s)
      kill -STOP "${drill_pid[sales-writer]}"; sleep 35; kill -CONT "${drill_pid[sales-writer]}" ;;
    *) die "unknown fault $1" ;;
  esac
}
end=$((SECONDS + duration - every))
n=0
while [ $SECONDS -lt $end ] && kill -0 $drill 2>/dev/null; do
  sleep "$every"
  set -- $faults
  shift $((n % $#))
  log "fault: $1"
  fault "$1"
  echo "$(date +%T.%N) $1" >>"$drill_dir/faults.log"
  n=$((n + 1))
done
status=0
wait $drill || status=$?
# A fault the run had no time for is said: a PASS without it checked less.
for f in $faults; do
  grep -q " $f\$" "$drill_dir/faults.log" 2>/dev/null || log "fault $f never ran: give the drill more time (SALESDRILL_DURATION=$((duration + 60)))"
done
log "salesdrill exited $status; logs in $drill_dir/logs, the history in $drill_dir/history.jsonl"
exit $status
