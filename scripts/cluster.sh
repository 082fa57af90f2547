#!/usr/bin/env bash
# Forge as a cluster on this machine: one PostgreSQL, N `forge serve` replicas, HAProxy in front.
#
#   scripts/cluster.sh up [N]       start (N replicas, default 2); waits until every part is ready and prints
#                                   the front URL as its last line
#   scripts/cluster.sh down         stop everything (the database's data stays in ./data/cluster)
#   scripts/cluster.sh kill NAME    SIGKILL one replica (r1, r2, ...): a crash, for failover tests
#   scripts/cluster.sh start NAME   start a replica again under its name (it rejoins)
#   scripts/cluster.sh status       what runs
#
# Installs Debian's postgresql and haproxy packages when they are missing (as root). PostgreSQL keeps its data
# in ./data/cluster/pg (initialised on first use) and listens on a unix socket in ./data/cluster/run only.
# Replicas listen on 127.0.0.1: FORGE_CLUSTER_PORT (default 8080) is the front, replica i gets that port + i.
# FORGE_SERVE_ARGS: more `forge serve` flags for every replica (e.g. "--threads 1 --api-key K");
# FORGE_CLUSTER_DIR moves ./data/cluster; FORGE_PYTHON: the Python whose packages run Forge.
# The HAProxy configuration is deploy/haproxy.cfg with this cluster's replicas as its servers.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${FORGE_CLUSTER_DIR:-$ROOT/data/cluster}
PG_BIN=${FORGE_PG_BIN:-/usr/lib/postgresql/15/bin}
READY_TIMEOUT_S=${FORGE_CLUSTER_READY_TIMEOUT_S:-600}
STOP_TIMEOUT_S=30
RUN=$DIR/run
LOGS=$DIR/logs
PIDS=$DIR/pids
STATE=$DIR/cluster.env

die() { echo "cluster.sh: $*" >&2; exit 1; }
say() { echo "cluster.sh: $*" >&2; }

python_bin() {
  if [[ -n ${FORGE_PYTHON:-} ]]; then echo "$FORGE_PYTHON"
  elif [[ -x $ROOT/.venv/bin/python ]]; then echo "$ROOT/.venv/bin/python"
  else command -v python3 || die "no python3: set FORGE_PYTHON"
  fi
}

# initdb and postgres refuse to run as root: as root they run as Debian's `postgres` user.
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

install_packages() {
  local missing=()
  [[ -x $PG_BIN/initdb ]] || missing+=(postgresql)
  command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "missing Debian packages: ${missing[*]} (install them, or run this as root)"
  say "installing Debian's ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

alive() { [[ -f $PIDS/$1.pid ]] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_postgres() {
  mkdir -p "$DIR/pg" "$RUN"
  touch "$LOGS/postgres.log"
  if [[ $(id -u) == 0 ]]; then chown postgres:postgres "$DIR/pg" "$RUN" "$LOGS/postgres.log"; fi
  chmod 700 "$DIR/pg" "$RUN"
  if [[ ! -f $DIR/pg/PG_VERSION ]]; then
    say "initialising PostgreSQL in $DIR/pg"
    # C.UTF-8: the text search parser classifies non-ASCII letters by the locale's ctype.
    as_pg "$PG_BIN/initdb" -D "$DIR/pg" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-instructions >/dev/null
  fi
  # No TCP: only the socket in $RUN (mode 700), so only this machine's owner of $RUN reaches it.
  as_pg setsid -w "$PG_BIN/pg_ctl" -D "$DIR/pg" -l "$LOGS/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -k $RUN -c listen_addresses='' -c max_connections=200" start >/dev/null
  head -1 "$DIR/pg/postmaster.pid" > "$PIDS/postgres.pid"
  if [[ -z $(as_pg "$PG_BIN/psql" -h "$RUN" -p "$PG_PORT" -U postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'forge'") ]]; then
    as_pg "$PG_BIN/createdb" -h "$RUN" -p "$PG_PORT" -U postgres forge
  fi
}

start_replica() {  # name port
  local name=$1 port=$2
  # shellcheck disable=SC2086  # FORGE_SERVE_ARGS is a list of flags
  (cd "$ROOT" && exec setsid "$PY" -m app.cli serve --host 127.0.0.1 --port "$port" --db "$DB_URL" \
    --replica-name "$name" ${FORGE_SERVE_ARGS:-} >>"$LOGS/$name.log" 2>&1 </dev/null) &
  echo $! > "$PIDS/$name.pid"
}

haproxy_config() {  # the deploy file with this cluster's servers between the `# servers` marks
  local servers_check="" servers_track="" i
  for ((i = 1; i <= N; i++)); do
    servers_check+="    server r$i 127.0.0.1:$((FRONT_PORT + i)) check"$'\n'
    servers_track+="    server r$i 127.0.0.1:$((FRONT_PORT + i)) track forge_sessions/r$i"$'\n'
  done
  awk -v check="$servers_check" -v track="$servers_track" -v sock="$RUN/haproxy.sock" '
    /^global/ { print; print "    stats socket " sock " mode 600 level admin"; next }
    /^backend / { backend = $2 }
    /^ *# servers/ { print; printf "%s", (backend == "forge_v1" ? track : check); skip = 1; next }
    /^ *# end servers/ { skip = 0 }
    !skip { print }' "$ROOT/deploy/haproxy.cfg"
}

start_haproxy() {
  haproxy_config > "$DIR/haproxy.cfg"
  FORGE_FRONT=127.0.0.1:$FRONT_PORT haproxy -c -q -f "$DIR/haproxy.cfg" || die "bad HAProxy configuration"
  (FORGE_FRONT=127.0.0.1:$FRONT_PORT exec setsid haproxy -db -f "$DIR/haproxy.cfg" >>"$LOGS/haproxy.log" 2>&1 \
    </dev/null) &
  echo $! > "$PIDS/haproxy.pid"
}

ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1/ready" || true) == 200 ]]; }

servers_up() {  # how many of HAProxy's session servers are UP
  "$PY" - "$RUN/haproxy.sock" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1]); s.sendall(b"show stat\n")
    data = b"".join(iter(lambda: s.recv(65536), b""))
except OSError:
    print(0); sys.exit()
rows = [r.split(",") for r in data.decode().splitlines() if r and not r.startswith("#")]
print(sum(1 for r in rows if r[0] == "forge_sessions" and r[1] not in ("FRONTEND", "BACKEND") and r[17] == "UP"))
EOF
}

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S)) i pending
  while :; do
    pending=()
    for ((i = 1; i <= N; i++)); do
      alive "r$i" || die "replica r$i exited during start-up: see $LOGS/r$i.log"
      ready "http://127.0.0.1:$((FRONT_PORT + i))" || pending+=("r$i")
    done
    alive haproxy || die "HAProxy exited: see $LOGS/haproxy.log"
    if ((${#pending[@]} == 0)) && [[ $(servers_up) == "$N" ]] && ready "http://127.0.0.1:$FRONT_PORT"; then
      return 0
    fi
    ((SECONDS < deadline)) || die "not ready after ${READY_TIMEOUT_S}s: ${pending[*]:-the HAProxy health checks}"
    sleep 0.5
  done
}

stop_pid() {  # name: SIGTERM, then SIGKILL after STOP_TIMEOUT_S
  local name=$1 pid t
  alive "$name" || { rm -f "$PIDS/$name.pid"; return 0; }
  pid=$(cat "$PIDS/$name.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for ((t = 0; t < STOP_TIMEOUT_S * 10; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDS/$name.pid"
}

load_state() { [[ -f $STATE ]] || die "no cluster here ($STATE): scripts/cluster.sh up first"; source "$STATE"; }

cmd_up() {
  N=${1:-2}
  [[ $N =~ ^[1-9][0-9]?$ ]] || die "N is a number of replicas from 1 to 99, not '$N'"
  if [[ -f $STATE ]]; then
    source "$STATE"
    for name in postgres haproxy $(for ((i = 1; i <= N; i++)); do echo "r$i"; done); do
      alive "$name" && die "$name is running: scripts/cluster.sh down first"
    done
  fi
  N=${1:-2}
  install_packages
  PY=$(python_bin)
  mkdir -p "$LOGS" "$PIDS"
  FRONT_PORT=${FORGE_CLUSTER_PORT:-8080}
  PG_PORT=$(free_port)  # names the socket file only (no TCP)
  DB_URL="postgresql+asyncpg://postgres@/forge?host=$RUN&port=$PG_PORT"
  printf 'N=%q\nPY=%q\nFRONT_PORT=%q\nPG_PORT=%q\nDB_URL=%q\n' "$N" "$PY" "$FRONT_PORT" "$PG_PORT" "$DB_URL" \
    > "$STATE"
  start_postgres
  (cd "$ROOT" && "$PY" -m app.cli migrate --db "$DB_URL" >>"$LOGS/migrate.log" 2>&1) \
    || die "migration failed: see $LOGS/migrate.log"
  for ((i = 1; i <= N; i++)); do start_replica "r$i" $((FRONT_PORT + i)); done
  start_haproxy
  wait_ready
  say "PostgreSQL (socket in $RUN), $N replica(s) on 127.0.0.1:$((FRONT_PORT + 1))-$((FRONT_PORT + N)); logs in $LOGS"
  echo "http://127.0.0.1:$FRONT_PORT"
}

cmd_down() {
  load_state
  stop_pid haproxy
  for f in "$PIDS"/r*.pid; do [[ -e $f ]] && stop_pid "$(basename "$f" .pid)"; done
  if [[ -f $DIR/pg/postmaster.pid ]]; then as_pg "$PG_BIN/pg_ctl" -D "$DIR/pg" -m fast -w stop >/dev/null || true; fi
  rm -f "$PIDS/postgres.pid"
  say "stopped (data kept in $DIR/pg)"
}

cmd_kill() {
  load_state
  [[ ${1:-} =~ ^r[0-9]+$ ]] || die "kill NAME: a replica's name (r1, r2, ...)"
  alive "$1" || die "$1 is not running"
  kill -KILL "$(cat "$PIDS/$1.pid")"
  rm -f "$PIDS/$1.pid"
  say "killed $1"
}

cmd_start() {
  load_state
  local i=${1#r}
  [[ ${1:-} =~ ^r[0-9]+$ ]] && ((i >= 1 && i <= N)) || die "start NAME: one of r1 .. r$N"
  alive "$1" && die "$1 is running"
  start_replica "$1" $((FRONT_PORT + i))
  wait_ready
  echo "http://127.0.0.1:$FRONT_PORT"
}

cmd_status() {
  load_state
  for f in postgres haproxy $(for ((i = 1; i <= N; i++)); do echo "r$i"; done); do
    if alive "$f"; then echo "$f running (pid $(cat "$PIDS/$f.pid"))"; else echo "$f stopped"; fi
  done
  echo "front http://127.0.0.1:$FRONT_PORT"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  kill) shift; cmd_kill "$@" ;;
  start) shift; cmd_start "$@" ;;
  status) cmd_status ;;
  *) die "usage: scripts/cluster.sh up [N] | down | kill NAME | start NAME | status" ;;
esac
