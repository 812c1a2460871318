#!/usr/bin/env bash
# make run: the whole stack natively on this machine. PostgreSQL and Redis
# live under .run/ (kept between runs), binaries come from bin/ (make build).
# Stays in the foreground; Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
. deploy/local/lib.sh

# refuse_second_run ends this script: another make run holds .run/lock.
refuse_second_run() {
  local holder
  holder=$(cat .run/lock 2>/dev/null)
  die "another make run${holder:+ (pid $holder)} is running in this clone ($root): stop it first (Ctrl-C in its terminal${holder:+, or kill -TERM $holder}); its .run/ and bin/ were left alone"
}
# --check: make run asks first whether another make run is up, before make
# build, which rebuilt bin/ under that stack's running binaries before this
# script refused. The lock is taken for good below.
if [[ ${1:-} == --check ]]; then
  [[ -e .run/lock ]] || exit 0
  exec 9<.run/lock
  flock -n 9 || refuse_second_run
  exit 0
fi
ensure_packages

# Every binary's output goes through bin/logcap (below): a bin/ built
# before it existed, run.sh run on it directly (make run builds it), gave
# each binary a pipe no one read, which SIGPIPE ended at its first line.
[ -x bin/logcap ] || die "bin/logcap is missing (a bin/ built before it existed?): run make build first, or make run, which builds it"

state=$root/.run
mkdir -p "$state/logs"
chmod 755 "$state"
# The logs and spans hold request ids, client addresses and paths: their
# files are made yours alone (pkg/cappedfile), and so is the directory.
chmod 700 "$state/logs"

# One make run per clone: a second one reused the first's PostgreSQL and
# Redis, said "Stack is up" (its health checks reached the first's
# binaries), found its own trace store's port taken, and stopped the
# PostgreSQL and Redis under .run/, the first's, leaving that stack
# answering 503. fd 9 holds the lock for this script alone: what it
# starts closes it (9>&-), so what a killed make run leaves running does
# not hold it (the next one stops that, below).
exec 9<>"$state/lock"
flock -n 9 || refuse_second_run
echo $$ >"$state/lock"

# The grace a binary has to stop after its first TERM, before it is killed
# (stop_one below, and the leftovers of a killed make run alike: the
# gateway's own stop takes up to 30 s, its 25 s drain and 5 s of last
# span flush, which a shorter wait would cut).
stop_grace=${RUN_STOP_GRACE:-35}
[[ $stop_grace =~ ^[0-9]{1,6}$ ]] && ((10#$stop_grace > 0)) || die "RUN_STOP_GRACE must be a whole number of seconds, at least 1, such as 35"
stop_grace=$((10#$stop_grace))

# What a make run ended by SIGKILL (or a crash of bash) left running: the
# binaries, in sessions of their own, outlive it, holding their ports, so
# the next one's processes could not listen and it stopped, every time,
# until they were found and killed by hand. .run/pids names them, with
# their start times: each still running (the same start time, not a
# process given its pid since, such as a shell in the clone) is stopped,
# newest first.
start_time() { # start_time PID: when it started, in clock ticks since boot
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  set -- $stat
  echo "${20}"
}
stop_leftovers() {
  local pid name started left=() i t
  while read -r pid name started; do
    [ -n "$started" ] && [ "$(start_time "$pid")" = "$started" ] && running "$pid" || continue
    log "$name (pid $pid) was left running by a make run that did not stop (killed?): stopping it"
    kill -TERM "$pid" 2>/dev/null || true
    left+=("$pid")
  done < <(tac "$state/pids")
  for i in "${left[@]}"; do
    for ((t = 0; t < stop_grace * 10; t++)); do running "$i" || break; sleep 0.1; done
    ! running "$i" || kill -KILL "$i" 2>/dev/null || true
  done
  rm -f "$state/pids"
}
[ ! -f "$state/pids" ] || stop_leftovers

# Secrets are made once per .run/ so cursors and signatures survive restarts.
if [ ! -f "$state/secrets" ]; then
  umask 077
  { echo "IDENTITY_SECRET=$(random_secret)"; echo "CURSOR_SECRET=$(random_secret)"; } >"$state/secrets"
  umask 022
fi
# shop-schema's identity secret, its own (below), also in a .run/ made
# before it had one.
add_secret "$state/secrets" SHOP_SCHEMA_IDENTITY_SECRET
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

# The size past which a log or the span file starts afresh, in MiB (0:
# none), checked before anything starts.
RUN_LOG_MAX_MB=${RUN_LOG_MAX_MB:-128}
[[ $RUN_LOG_MAX_MB =~ ^[0-9]{1,9}$ ]] || die "RUN_LOG_MAX_MB must be a number of MiB, such as 128 (0: logs never start afresh within a run)"
RUN_LOG_MAX_MB=$((10#$RUN_LOG_MAX_MB))

# Listeners: anything already in the environment wins.
export GATEWAY_ADDR="${GATEWAY_ADDR:-127.0.0.1:8080}"
export EXPORT_READER_ADDR="${EXPORT_READER_ADDR:-127.0.0.1:8081}"
export SALES_WRITER_ADDR="${SALES_WRITER_ADDR:-127.0.0.1:8082}"
export SHOP_SCHEMA_ADDR="${SHOP_SCHEMA_ADDR:-127.0.0.1:8083}"
# reachable ADDR: where a client on this machine reaches a listener on ADDR.
# One on every address (:8080, 0.0.0.0:8080, [::]:8080) is reached on
# loopback: curl refuses http://:8080, so GATEWAY_ADDR=:8080 gave a BASE_URL
# no curl line of the README could use, and make run waited 10 s for a
# gateway that answered, then said it was not answering.
reachable() {
  local host=${1%:*} port=${1##*:}
  case "$host" in ""|0.0.0.0) host=127.0.0.1 ;; "[::]") host="[::1]" ;; esac
  echo "$host:$port"
}
export EXPORT_READER_URLS="${EXPORT_READER_URLS:-http://$(reachable "$EXPORT_READER_ADDR")}"
export SALES_WRITER_URLS="${SALES_WRITER_URLS:-http://$(reachable "$SALES_WRITER_ADDR")}"
export SHOP_SCHEMA_URLS="${SHOP_SCHEMA_URLS:-http://$(reachable "$SHOP_SCHEMA_ADDR")}"

# Every address must be free before anything starts. With one taken (a
# make run in another clone, a binary run by hand), the health checks
# reached whatever held it, make run said "Stack is up", and then stopped
# when its own process could not listen, naming only a log file.
# listening ADDR: something accepts connections on ADDR (host:port,
# [v6]:port or :port; port 0 picks a free one).
listening() {
  local host=${1%:*} port=${1##*:}
  host=${host#[}; host=${host%]}
  [ "$port" != 0 ] && (: <>"/dev/tcp/${host:-127.0.0.1}/$port") 2>/dev/null
}
# holder ADDR names the process listening on ADDR's port, when ss can see it.
holder() {
  local pid
  pid=$(ss -Hltnp "sport = :${1##*:}" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  [ -n "$pid" ] || { echo "a process this user cannot see"; return 0; }
  echo "$(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid, in $(readlink "/proc/$pid/cwd" 2>/dev/null || echo '?'))"
}
check_free() { # check_free NAME...: each a variable holding an address
  local name
  for name in "$@"; do
    ! listening "${!name}" || die "$name ${!name} is taken by $(holder "${!name}"): stop that, or give make run another address ($name=127.0.0.1:PORT make run)"
  done
}
# same_listener A B: addresses A and B take one port of one host (the same
# port, and the same host or either one every address: empty, 0.0.0.0, ::;
# localhost is 127.0.0.1, the address Go's listener takes for it, its
# IPv4 one, where /etc/hosts gives it ::1 too: localhost:P beside [::1]:P
# both listen, as the binaries' own check says, pkg/envconfig). Each
# binary refuses its own two so; across binaries, the second to start
# failed to listen after the stack had begun, naming only its log.
same_listener() {
  local host_a=${1%:*} host_b=${2%:*} port=${1##*:}
  host_a=${host_a#[}; host_a=${host_a%]}; host_b=${host_b#[}; host_b=${host_b%]}
  host_a=${host_a,,}; host_b=${host_b,,}
  [ "$host_a" != localhost ] || host_a=127.0.0.1
  [ "$host_b" != localhost ] || host_b=127.0.0.1
  [ "$port" != 0 ] && [ "$port" -eq "${2##*:}" ] 2>/dev/null || return 1
  case "$host_a|$host_b" in "|"*|*"|"|0.0.0.0\|*|*\|0.0.0.0|::\|*|*\|::) return 0 ;; esac
  [ "$host_a" = "$host_b" ]
}
check_separate() { # check_separate NAME...: no two of the addresses they hold take one port
  local a b
  for a in "$@"; do
    for b in "$@"; do
      [[ "$a" < "$b" ]] || continue
      ! same_listener "${!a}" "${!b}" || die "$a (${!a}) and $b (${!b}) take the same port: give each listener its own address"
    done
  done
}
: "${GATEWAY_ADMIN_ADDR:=127.0.0.1:9080}" "${EXPORT_READER_ADMIN_ADDR:=127.0.0.1:9081}"
: "${SALES_WRITER_ADMIN_ADDR:=127.0.0.1:9082}" "${SHOP_SCHEMA_ADMIN_ADDR:=127.0.0.1:9083}"
listeners=(GATEWAY_ADDR EXPORT_READER_ADDR SALES_WRITER_ADDR SHOP_SCHEMA_ADDR
  GATEWAY_ADMIN_ADDR EXPORT_READER_ADMIN_ADDR SALES_WRITER_ADMIN_ADDR SHOP_SCHEMA_ADMIN_ADDR)
[ -n "${OTEL_EXPORTER_OTLP_ENDPOINT:-}" ] || { : "${TRACESTORE_ADDR:=127.0.0.1:4318}"; listeners+=(TRACESTORE_ADDR); }
check_separate "${listeners[@]}"
check_free "${listeners[@]}"

pids=()
declare -A names # pid → name, to say which process exited
stopping=
hurry=
# stop_one PID: TERM, then wait; a process still there after stop_grace
# (longer than any binary's own stop: the gateway drains for 25 s,
# shop-schema for 22 s, and each flushes its spans for 5 s more; each
# binary's TestSettingsAsDocumentedAndDeployed holds it so) is killed, so that Ctrl-C always ends
# make run (once, under heavy load, tracestore was seen to outlive its TERM
# and make run waited for ever). Once hurried (a second Ctrl-C), TERM is
# sent again: a second signal ends a binary at once (pkg/stopsignal); sent
# until it is gone, as two sent together may arrive as one. The wait is
# wait "$pid", which returns as the process ends, or has ended (bash keeps
# its status), or as a trapped signal arrives: the timer's USR1 once
# stop_grace has passed (grace_over), or a second Ctrl-C. It was wait -n on the process
# and the timer, but a process that ended between the look (stopped) and
# that wait was no job of bash's any more: wait -n named it "no such job"
# and waited for the timer alone, and Ctrl-C took stop_grace (35 s) more
# for that binary (1 of 2 stops of a smoke run). Polled every 0.1 s
# instead, each binary's stop took up to 0.1 s more than its own.
# RUN_STOP_GRACE sets it (seconds, read above stop_leftovers); shorter
# than a binary's drain, it cuts that drain off.
grace_over=
trap 'grace_over=1' USR1
stop_one() {
  local pid=$1 timer
  kill -TERM "$pid" 2>/dev/null || return 0
  grace_over=
  # The timer reads a pipe whose other end this script alone holds, rather
  # than sleeping: a make run killed (kill -9) closes it, and the timer
  # ends at once (read fails, no USR1), where a sleep would outlive it by
  # up to stop_grace. SIGINT ignored (an asynchronous command): a second
  # Ctrl-C does not end it. fd 9 (the lock) is closed within: a
  # redirection of the group would leave the timer the copy bash saves to
  # restore fd 9 after the group, and the timer would hold the lock.
  # Once the grace is over it signals every second until it is killed
  # below: a USR1 that came between the look at grace_over and the wait
  # would have been the last, and the wait would not have ended.
  coproc TIMER {
    exec 9>&-
    read -r -t "$stop_grace" _
    (($? > 128)) || exit 0 # the pipe closed: make run is gone
    while kill -USR1 $$ 2>/dev/null; do sleep 1; done
  }
  timer=$TIMER_PID
  while ! stopped "$pid"; do
    # The grace bounds a hurried stop too: a binary that outlives its
    # second TERM as well is killed, or make run waited for ever.
    if [ -n "$grace_over" ]; then
      log "${names[$pid]:-pid $pid} did not stop within ${stop_grace}s of TERM: killed"
      kill -KILL "$pid" 2>/dev/null || true
      break
    elif [ -n "$hurry" ]; then
      kill -TERM "$pid" 2>/dev/null || true
      sleep 0.1 || true # a Ctrl-C ends the sleep too: not a failure (set -e)
    else
      wait "$pid" 2>/dev/null || true
    fi
  done
  kill "$timer" 2>/dev/null || true
  wait "$timer" "$pid" 2>/dev/null || true
}
# stopped PID: gone, or exited and not yet reaped (a zombie). The read's
# own 2>/dev/null, before its <, quiets a /proc file that is gone: a
# group's ({ ...; } 2>/dev/null) would also send the line of a trap run
# within it (stop_now, a second Ctrl-C) to /dev/null.
stopped() {
  local proc_state
  read -r _ _ proc_state _ 2>/dev/null <"/proc/$1/stat" || return 0
  [ "$proc_state" = Z ]
}
# A Ctrl-C (or TERM) while stopping ends every process at once, as a second
# Ctrl-C does to a binary run by hand; without this trap it would end this
# script alone and leave the binaries, in sessions of their own, running.
stop_now() {
  [ -n "$hurry" ] || log "stopping again: ending the rest at once (their drains are cut off)"
  hurry=1
}
stop_all() {
  # Every step runs, whatever the one before returned or whoever hangs up:
  # the binaries are in sessions of their own, so a stop cut short leaves
  # them running. Under set -e a log line written to a closed terminal
  # (EIO) ended it at its first line, and a write to a pipe whose reader is
  # gone kills with SIGPIPE; a hang-up signals this script, not them.
  set +e
  trap '' HUP PIPE
  trap - EXIT
  trap stop_now INT TERM
  stopping=1
  [ -z "${tick:-}" ] || kill "$tick" 2>/dev/null || true
  log "stopping"
  # Newest first, one at a time, each told once (a second signal would end
  # it at once): the gateway drains while the services still answer, and
  # tracestore, started first, stops last, so the spans the others flush as
  # they stop are kept (stopped together, their last batch was lost).
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    stop_one "${pids[i]}"
  done
  rm -f "$state/pids"
  redis_stop "$state/redis"
  pg_stop "$state/pg"
  if [ -f "$state/pg/data/postmaster.pid" ]; then
    log "stopped, but for PostgreSQL (above)"
  else
    log "stopped"
  fi
}
# A shell starts a background job with SIGINT ignored, and bash cannot trap
# a signal ignored when it started: such a make run (`make run &` in a
# script) stops on TERM only.
stop_how="Ctrl-C stops everything."
if [ -n "$(trap -p INT)" ]; then
  stop_how="kill -TERM $$ stops everything (started in the background: SIGINT is ignored)."
  log "SIGINT is ignored here (started in the background): stop with kill -TERM $$ (this script alone: its binaries must not be signalled twice)"
fi
# A trap runs in the scope of the function it interrupts, whose locals hide
# the globals of the same name: a Ctrl-C that came while stopped() or
# running() read a process's state (their local was named state) sent
# stop_all to stop PostgreSQL and Redis under S/ instead of .run/, and make
# run said "stopped" and left both running (once in CI, under load). So no
# function here or in lib.sh names a local as a global the stop reads
# (TestScriptLocalsHideNothingTheirStopReads).
# A signal during the start ends the script once everything is stopped:
# returning to where the start was, it went on to start the rest (the
# gateway, left running after make run had ended).
trap 'stop_all; exit 0' INT TERM
trap stop_all EXIT

log "starting PostgreSQL and Redis under .run/"
pg_start "$state/pg"
redis_start "$state/redis"
pg_create_db "$state/pg" exportsvc

# Settings: anything already in the environment wins.
# .run/'s path as the URLs hold it (a clone's path may have a space).
state_in_url=$(url_path "$state")
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@/exportsvc?host=$state_in_url/pg}"
export REDIS_URL="${REDIS_URL:-unix://$state_in_url/redis/redis.sock}"
export BASE_URL="http://$(reachable "$GATEWAY_ADDR")/v1"

log "migrating"
bin/exportctl migrate >/dev/null

demo=$state/demo.env
# A demo.env kept while the database went (.run/pg deleted alone) names
# an owner and keys the new one lacks: make run said "Stack is up" with no
# demo data, and the curl it prints answered 401. Made anew then.
if [ -f "$demo" ]; then
  demo_owner=$(sed -n 's/^\(export \)\{0,1\}DEMO_OWNER_ID=//p' "$demo")
  owners=$(bin/exportctl owner list --json) # a failure stops make run, demo.env kept
  if [[ -z $demo_owner || $owners != *"\"id\":\"$demo_owner\""* ]]; then
    log ".run/demo.env names an owner the database lacks (.run/pg deleted?): making the demo data anew"
    rm -f "$demo"
  fi
fi
if [ ! -f "$demo" ]; then
  log "creating demo owner, platform, 1,000 items and two keys"
  owner=$(bin/exportctl owner create --name "Demo coins" --json | json_field id)
  # A first start stopped during these steps (a Ctrl-C while it seeds)
  # wrote no demo.env but may have made the platform, which a second
  # create refuses: make run then failed here every time until .run/ went.
  platforms=$(bin/exportctl platform list --json)
  [[ $platforms == *'"id":"demo-market"'* ]] ||
    bin/exportctl platform create --id demo-market --name "Demo marketplace" >/dev/null
  bin/exportctl items seed --owner "$owner" --count 1000 --seed 1 >/dev/null
  read_key=$(bin/exportctl key create --owner "$owner" --scope export:read --name demo-read --json | json_field key)
  write_key=$(bin/exportctl key create --owner "$owner" --scope sales:write --platform demo-market --name demo-write --json | json_field key)
  umask 077
  printf 'export DEMO_OWNER_ID=%s\nexport DEMO_READ_KEY=%s\nexport DEMO_WRITE_KEY=%s\n' "$owner" "$read_key" "$write_key" >"$demo"
  umask 022
fi
# Exported, as .run/env's, so that a client started from the shell that
# read it (a Python or Node program from the guides) sees the keys: set
# alone, os.environ["DEMO_READ_KEY"] was a KeyError. A demo.env of an
# earlier make run, kept, is given its exports.
sed -i 's/^DEMO_/export DEMO_/' "$demo"

# Exported, so that `. .run/env` serves exportctl and any other child; each
# value single-quoted (shell_quote, lib.sh), which POSIX shells read
# alike; readable by you only, as a DATABASE_URL given may hold a password.
umask 077
{
  echo "export DATABASE_URL=$(shell_quote "$DATABASE_URL")"
  echo "export REDIS_URL=$(shell_quote "$REDIS_URL")"
  echo "export BASE_URL=$(shell_quote "$BASE_URL")"
} >"$state/env"
umask 022

# Each make run starts its logs and spans afresh and keeps the last run's
# once, as NAME.1 (make trace reads traces.jsonl.1 too): appended run
# after run, they only grew (a run under load writes about 1 GB an hour,
# README). After stop_leftovers (a binary left running would write on in
# the .1), and only once this run starts its binaries: one that stopped
# before (an address taken, a migration failed) moved the last run's files
# to .1 and wrote none, so make trace could not open traces.jsonl and
# .run/logs/ held no log.
for f in "$state"/logs/*.log "$state/traces.jsonl"; do
  [ ! -f "$f" ] || mv -f "$f" "$f.1"
  # The one kept is yours alone, whatever made it: the last run's, or an
  # older one this run keeps (no span file then: traces.jsonl.1 is in
  # .run/, which others may read, not in .run/logs/). One another user
  # owns (a sudo make run's) is said, not fatal (set -e).
  [ ! -f "$f.1" ] || chmod 600 "$f.1" || log "${f#"$root"/}.1 is not yours: others may read it"
done

# Within a run, each file that reaches RUN_LOG_MAX_MB becomes NAME.1 in
# turn (the last run's then gone) and starts afresh: a stack left up under
# load for days filled the disk. The binaries' output goes through logcap,
# which does so (they write to stdout, and a file the shell appends to
# cannot be moved under them), tracestore's own lines too; tracestore caps
# its span file itself.
log_max_bytes=$((RUN_LOG_MAX_MB << 20))

# Every binary runs in a session of its own, like PostgreSQL and Redis, so
# that stop_all alone signals it, once and in its turn: Ctrl-C signals the
# terminal's whole process group at once, and stop_all's TERM after it would
# be a second signal, which ends a binary at once, its drain cut off and its
# last spans lost (pkg/stopsignal). tracestore must also outlive the others,
# to receive the spans they flush as they stop.
own_session=$(command -v setsid || true)
# logcap ignores the terminal's signals and ends when the binary's output
# does: ended first, it would close the pipe under a binary still
# draining, which SIGPIPE ends.
log_to() { # log_to NAME: writes its input to .run/logs/NAME.log, capped
  exec $own_session bin/logcap --file "$state/logs/$1.log" --max-bytes "$log_max_bytes" 9>&-
}
start() { # start NAME: runs bin/NAME in the background, logging to .run/logs
  local name=$1
  [ -x "bin/$name" ] || { log "bin/$name not built: skipped"; return 0; }
  $own_session "bin/$name" > >(log_to "$name") 2>&1 9>&- &
  pids+=($!); names[$!]=$name
  echo "$! $name $(start_time $!)" >>"$state/pids"
  log "$name started (pid $!, log .run/logs/$name.log)"
}
# Local trace view: every binary exports its spans to tracestore, which
# appends them to .run/traces.jsonl (make trace ID=<request_id> prints one).
# An OTEL_EXPORTER_OTLP_ENDPOINT already set (Jaeger, Tempo, a collector) wins.
if [ -z "${OTEL_EXPORTER_OTLP_ENDPOINT:-}" ]; then
  $own_session "bin/tracestore" serve --addr "${TRACESTORE_ADDR:-127.0.0.1:4318}" --file "$state/traces.jsonl" \
    --max-bytes "$log_max_bytes" > >(log_to tracestore) 2>&1 9>&- &
  pids+=($!); names[$!]=tracestore
  echo "$! tracestore $(start_time $!)" >>"$state/pids"
  export OTEL_EXPORTER_OTLP_ENDPOINT="http://$(reachable "${TRACESTORE_ADDR:-127.0.0.1:4318}")"
  export OTEL_BSP_SCHEDULE_DELAY="${OTEL_BSP_SCHEDULE_DELAY:-500}"
fi
start export-reader
start sales-writer
# shop-schema verifies with a secret of its own, the gateway's
# SHOP_SCHEMA_IDENTITY_SECRET, and holds no IDENTITY_SECRET, current or
# previous: it reads merchants' servers, and must hold nothing that signs
# for the other two (README, "Rotating IDENTITY_SECRET").
IDENTITY_SECRET=$SHOP_SCHEMA_IDENTITY_SECRET IDENTITY_SECRET_PREVIOUS= start shop-schema
# any_gone: a binary has ended (refused its settings, crashed). The wait
# below says which, with its status.
any_gone() {
  local pid
  for pid in "${pids[@]}"; do
    stopped "$pid" && return 0
  done
  return 1
}
# answers URL: polls URL for up to 10 s; false when it did not answer, or
# at once when a binary has ended (a start that failed is said below).
answers() {
  local i
  for i in $(seq 100); do
    curl -fsS "$1" >/dev/null 2>&1 && return 0
    any_gone && return 1
    sleep 0.1
  done
  curl -fsS "$1" >/dev/null 2>&1
}
# The gateway starts once the services answer: its first health probe would
# otherwise find one still starting and report it down for a few seconds.
for addr in "$EXPORT_READER_ADDR" "$SALES_WRITER_ADDR" "$SHOP_SCHEMA_ADDR"; do
  any_gone || answers "http://$(reachable "$addr")/healthz" ||
    any_gone || log "the service on $addr is not answering yet: see .run/logs/"
done
any_gone || start gateway
any_gone || answers "$BASE_URL/health" ||
  any_gone || log "gateway is not answering yet: see .run/logs/gateway.log"

# A binary that ended during the start (a setting it refused) gets no
# banner: "Stack is up" above its "exited (status 1)" read as a start that
# worked, and the wait below says what ended.
any_gone || cat <<MSG

  Stack is up.  Base URL: $BASE_URL
  Demo keys: .run/demo.env (readable by you only; keys stay out of this output,
  which may end up in a log): DEMO_READ_KEY (export:read),
  DEMO_WRITE_KEY (sales:write, platform demo-market)
  Settings for scripts: .run/env     Logs: .run/logs/
  Traces: make trace ID=<meta.request_id>   (spans in .run/traces.jsonl)

  . .run/env; . .run/demo.env
  curl -s -H "X-API-Key: \$DEMO_READ_KEY" "\$BASE_URL/export/items?limit=2"

  $stop_how
MSG

# Stay in the foreground until a process dies or the user presses Ctrl-C.
# A binary killed by a signal before bash waits for it is no job of bash's
# any more (bash reaps it, reports "Killed" and forgets the job), and
# wait -n names it "no such job" and waits on for the others: a binary
# killed while the rest started (kill -9, the OOM killer) left make run up
# without it. So every binary is looked at before each wait (first_gone),
# and each wait ends after at most 2 s (a tick) to look again. The wait's
# stderr is dropped ("no such job", and bash's report of a kill it reaps
# while waiting: the line below says it in the script's words; a kill
# reaped earlier is reported by bash then). The tick closes fd 9 (the lock), as all
# the script starts does: a make run killed (kill -9) leaves it for up to
# 2 s, and holding the lock it made the next make run, started then, say
# that one, gone, still ran.
exited= status=0 tick=
first_gone() {
  local pid
  for pid in "${pids[@]}"; do
    if stopped "$pid"; then
      exited=$pid
      wait "$pid" 2>/dev/null || status=$? # bash keeps its status, job or not
      return 0
    fi
  done
  return 1
}
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501 )); then
  until first_gone; do
    sleep 2 9>&- &
    tick=$!
    wait -n -p exited "${pids[@]}" "$tick" 2>/dev/null || status=$?
    [ "${exited:-}" = "$tick" ] || break
    exited= status=0 tick=
  done
  [ -z "$tick" ] || kill "$tick" 2>/dev/null || true
  tick=
else # wait -p is bash 5.1's: without it, which process exited is not known
  # A binary that ended during the start (a setting refused) was reaped
  # then, and is no job of bash's any more: looked for first, or wait -n
  # (which waits for the next job to end before 5.1, whatever pids it is
  # given) waited on the others, and make run, its banner left out, said
  # nothing until Ctrl-C.
  first_gone || wait -n "${pids[@]}" 2>/dev/null || status=$?
fi
name=${exited:+${names[$exited]:-}}
# The binaries end with status 0 only when signalled, and Ctrl-C reaches
# this script alone (they run in sessions of their own): one was sent a
# signal of its own (kill PID). The line says so, a stop and not a crash.
if [ -z "$stopping" ] && [ "$status" = 0 ]; then
  log "${name:-a process} stopped on a signal (a kill of its pid); stopping the rest"
elif [ -z "$stopping" ]; then
  log "${name:-a process} exited (status $status): see .run/logs/${name:+$name.log} (stopping the rest)"
  # make run fails with it (the EXIT trap stops the rest first): a script
  # or a CI job running make run can tell a crash, or a start refused,
  # from a stop.
  exit 1
fi
