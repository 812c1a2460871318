# Shared shell functions for running PostgreSQL and Redis natively (no Docker)
# under a project-local folder, and the toolchain every go command of these
# scripts uses. Sourced by every script here (envdoc's
# TestLocalScriptsRunGoWithTheWorkspaceToolchain holds those that run go to it).

# go.work's toolchain line is the Go that builds and tests; auto lets the go
# command fetch it where the machine's Go is older and set to local (as make
# does), so a script run without make builds with the same Go.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }

# pg_bin_dir prints the folder holding initdb and pg_ctl.
pg_bin_dir() {
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -n -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

# ensure_packages installs redis-server, PostgreSQL (server and client) and curl
# when missing (install_packages).
ensure_packages() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  pg_bin_dir >/dev/null || missing+=(postgresql)
  command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  install_packages "${missing[@]}"
}

# install_packages installs the Debian packages it is given, if any: with
# apt-get as root, else it stops saying exactly what to install.
install_packages() {
  [ $# -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing $* with apt-get"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null || die "apt-get install $* failed"
  else
    die "missing $*: install them (Debian/Ubuntu: sudo apt-get install -y $*)"
  fi
}

# as_pg_user runs a command as the user that owns the cluster: initdb refuses
# to run as root, so as root that is the "postgres" user.
as_pg_user() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_wal_opts are the write-ahead-log settings of a write-heavy service
# (every sale is a durable commit). Out of the box, PostgreSQL checkpoints
# every 1 GB of WAL, and after each checkpoint the first change to every page
# logs the whole 8 kB page: a confirm + cancel pair, which touches pages all
# over a million-item table, wrote 13.6 kB of WAL, most of it page images,
# and each commit waited for it to reach the disk. lz4 compresses those
# images, and checkpoints every 4 GB or 15 minutes log them less often:
# pairs per second rose 15-30% in pgbench runs of the sales statements with
# synchronous commit. Durability is unchanged (fsync and synchronous commit
# stay on); crash recovery may replay more WAL.
pg_wal_opts="-c max_wal_size=4GB -c checkpoint_timeout=15min"

# pg_socket_opts keep the Unix socket to the server's user (and root).
pg_socket_opts="-c unix_socket_permissions=0700"

# pg_wal_compression is lz4 when the server was built with it (Debian's
# is), else pglz, which every build has: an unknown method stops the server.
pg_wal_compression() {
  if ldd "$1/postgres" 2>/dev/null | grep -q liblz4; then echo lz4; else echo pglz; fi
}

# pg_start and redis_start close fd 9, make run's lock on its .run/ (run.sh),
# in the servers they start: a server that outlived a killed make run
# would hold it, and every later make run would say one is running.

# pg_start DIR starts (creating on first use) a cluster in DIR/data that
# listens only on a Unix socket in DIR. The cluster trusts whoever connects
# (initdb -A trust) as the superuser, so the socket is its owner's alone
# (pg_socket_opts): DIR must be traversable (as root, the server runs as
# postgres and the clients as root), and PostgreSQL's default socket mode,
# 0777, let every local account connect, mint API keys for any owner and run
# programs as the server's user (COPY ... TO PROGRAM). Redis's socket is 0700
# for the same reason.
# shell_quote WORD prints WORD single-quoted for sh (a quote inside written
# '\''): pg_ctl runs the server through sh -c with its -o options, so a
# socket folder unquoted there (a clone's path with a space) split into
# arguments, and PostgreSQL did not start ("invalid argument").
shell_quote() { local q="'\\''"; printf "'%s'" "${1//\'/$q}"; }

# url_path PATH prints PATH percent-encoded for a URL (a space or a
# non-ASCII letter of a clone's path: DATABASE_URL and REDIS_URL with it
# raw were refused).
url_path() {
  local LC_ALL=C i c out=
  for ((i = 0; i < ${#1}; i++)); do
    c=${1:i:1}
    case $c in [A-Za-z0-9/._~-]) out+=$c ;; *) out+=$(printf '%%%02X' "'$c") ;; esac
  done
  printf '%s' "$out"
}

# pg_wait_shutdown DIR BIN waits, saying so, while the cluster in DIR is
# still shutting down (a make run's stop that pg_stop gave up waiting for):
# taken for running, it was reused, and refused every connection ("the
# database system is shutting down"). A server that is starting instead
# (recovery) is waited for too, until it accepts connections.
pg_wait_shutdown() {
  local dir=$1 bin=$2 i said= isready
  # The client package's, on PATH as psql is; else beside pg_ctl.
  isready=$(command -v pg_isready || echo "$bin/pg_isready")
  for i in $(seq 600); do
    as_pg_user "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1 || return 0
    local code=0
    "$isready" -q -h "$dir" -t 2 || code=$?
    [ "$code" = 1 ] || return 0 # accepting (0), or not answering at all (2): nothing to wait for
    [ -n "$said" ] || { log "waiting for PostgreSQL in $dir, still shutting down (or starting) from an earlier run"; said=1; }
    sleep 0.5
  done
  die "PostgreSQL in $dir is still shutting down after 5 minutes: see $dir/server.log"
}

pg_start() {
  local dir=$1 bin
  bin=$(pg_bin_dir) || die "PostgreSQL server binaries not found"
  mkdir -p "$dir"
  # Absolute, as in redis_start: the server changes into its data folder
  # before it opens the socket's lock file named under -k, so a relative
  # folder named one under the data folder that did not exist, and it did
  # not start ("could not create lock file"); psql takes only an absolute
  # folder for -h too.
  dir=$(CDPATH='' cd -- "$dir" && pwd)
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg_user "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  fi
  pg_wait_shutdown "$dir" "$bin"
  if as_pg_user "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    # Left running by an older make run, its socket may still be 0777: the
    # kernel checks the socket file's mode on connect, so tightening it
    # needs no restart.
    as_pg_user chmod 700 "$dir"/.s.PGSQL.*[0-9] 2>/dev/null || true
    return 0
  fi
  as_pg_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses='' -k $(shell_quote "$dir") $pg_socket_opts -c max_connections=400 -c shared_buffers=${PG_SHARED_BUFFERS:-512MB} $pg_wal_opts -c wal_compression=$(pg_wal_compression "$bin") ${PG_EXTRA_OPTS:-}" start >/dev/null 9>&- \
    || { tail -20 "$dir/server.log" >&2; die "PostgreSQL did not start"; }
}

# pg_stop DIR stops the cluster in DIR/data (fast: sessions ended, then its
# shutdown checkpoint), waiting PG_STOP_TIMEOUT seconds at most (60, as
# pg_ctl's default).
pg_stop() {
  local dir=$1 bin wait=${PG_STOP_TIMEOUT:-60}
  bin=$(pg_bin_dir) || return 0
  [ -f "$dir/data/PG_VERSION" ] || return 0
  as_pg_user "$bin/pg_ctl" -D "$dir/data" -m fast -w -t "$wait" stop >>"$dir/stop.log" 2>&1 && return 0
  # pg_ctl gave up waiting: the server is still writing its shutdown
  # checkpoint (a slow disk, a large shared_buffers), or is stuck. Said, so
  # that "stopped" is not believed, and a make run started at once knows
  # why PostgreSQL refuses it ("the database system is shutting down").
  if [ -f "$dir/data/postmaster.pid" ]; then
    log "PostgreSQL in $dir is still shutting down after $wait s: it ends on its own (its log: $dir/server.log)"
  fi
}

# pg_create_db DIR NAME creates database NAME when missing.
pg_create_db() {
  local dir=$1 name=$2
  if ! psql -h "$dir" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$name'" | grep -q 1; then
    psql -h "$dir" -U postgres -d postgres -qc "CREATE DATABASE $name" >/dev/null || die "create database $name failed"
  fi
}

# redis_start DIR starts redis-server on a Unix socket DIR/redis.sock,
# waiting REDIS_START_TIMEOUT seconds (5) at most for its socket and pid
# file: polls every 0.1 s, so a loaded machine, whose polls take longer,
# waits longer, never less.
redis_start() {
  local dir=$1 wait=${REDIS_START_TIMEOUT:-5}
  mkdir -p "$dir"
  # Absolute: redis-server changes into --dir before it opens its log file
  # and socket, so a relative folder named files under itself that did not
  # exist, and it did not start. CDPATH emptied: a cd that finds its folder
  # through the caller's CDPATH (.:~ is common) prints it, and dir was then
  # the path twice, on two lines.
  dir=$(CDPATH='' cd -- "$dir" && pwd)
  if [ -f "$dir/redis.pid" ] && running "$(cat "$dir/redis.pid")"; then return 0; fi
  redis-server --port 0 --unixsocket "$dir/redis.sock" --unixsocketperm 700 --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir" >/dev/null 9>&- \
    || die "redis-server did not start"
  # The pid file too: redis-server (7.0) opens its socket before it writes
  # the file, and a redis_stop in between found no file and left the
  # server running (a test that started and stopped one at once left one
  # behind on a loaded machine).
  local i
  for i in $(seq $((wait * 10))); do [ -S "$dir/redis.sock" ] && [ -s "$dir/redis.pid" ] && return 0; sleep 0.1; done
  die "redis-server did not open $dir/redis.sock (or write $dir/redis.pid) within $wait s (REDIS_START_TIMEOUT)"
}

redis_stop() {
  local dir=$1 pid i
  [ -f "$dir/redis.pid" ] || return 0
  pid=$(cat "$dir/redis.pid")
  kill "$pid" 2>/dev/null || true
  # Waited for: redis-server writes its log and removes its socket as it
  # exits, and a caller removing the folder meanwhile failed with
  # "Directory not empty" (make test's clean-up, after every test passed).
  for i in $(seq 100); do running "$pid" || break; sleep 0.05; done
  rm -f "$dir/redis.pid"
}

# running PID: the process has not exited. An exited one not yet reaped (a
# zombie: redis-server daemonizes, and its new parent may reap it late)
# counts as exited; kill -0 would say it runs.
running() {
  [ -r "/proc/$1/stat" ] || return 1
  local proc_state
  proc_state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$proc_state" ] && [ "$proc_state" != Z ]
}

# random_secret prints 48 random url-safe characters.
random_secret() { head -c 36 /dev/urandom | base64 | tr '+/' '-_'; }

# add_secret FILE NAME: adds NAME=<a random secret> to FILE, a secrets file
# of NAME=value lines, unless it has a NAME line already (one made before
# NAME existed); appended, the file keeps its mode. A last line without its
# newline (a hand edit) gets one first: the new line glued to it changed
# that secret, and NAME was still missing.
add_secret() {
  grep -q "^$2=" "$1" && return 0
  [ -z "$(tail -c 1 "$1")" ] || echo >>"$1"
  echo "$2=$(random_secret)" >>"$1"
}

# json_field NAME reads one flat JSON object on stdin and prints the string
# value of NAME (enough for exportctl's --json output; no jq needed).
json_field() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
