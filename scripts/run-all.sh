#!/usr/bin/env bash
# `./dev run`: the whole system on this machine with embedded defaults.
#
# Starts, in order: a private PostgreSQL (unless DATABASE_URL is set), the bundled
# local model server (after fetching its weights once), the AI gateway, and the
# monolith's web and worker roles; seeds the demo instance; prints a token and a
# GraphQL request to paste. Ctrl-C stops everything, the database included when
# this script started it.
#
# Ports: gateway 5052, monolith 3000, local model server 5053, PostgreSQL 54329.
# Any provider configured in the environment (ANTHROPIC_API_KEY, OPENAI_BASE_URL)
# is passed through to the gateway and replaces the local model server.
#
# Stopping: Ctrl-C, SIGTERM or SIGHUP stop every process this script started
# (the database too, when it started it). A run killed outright (SIGKILL) leaves
# its processes running; the next run stops them first (their ids are kept in
# the run directory). For tests: DUO_RUN_DIR (run directory), DUO_RUN_BIN (use
# these binaries, do not build), DUO_PG_PORT and DUO_PG_DIR (a private database).
#
# Another GGUF chat model for the bundled server: `./dev run --chat-model PATH
# [--chat-template FILE]` (the same as DUO_LOCAL_LLM_CHAT_MODEL and
# DUO_LOCAL_LLM_CHAT_TEMPLATE; docs/local-llm.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

while [ $# -gt 0 ]; do
  case "$1" in
    --chat-model) export DUO_LOCAL_LLM_CHAT_MODEL="$(realpath "${2:?--chat-model needs a path}")"; shift 2 ;;
    --chat-template) export DUO_LOCAL_LLM_CHAT_TEMPLATE="$(realpath "${2:?--chat-template needs a file}")"; shift 2 ;;
    *) echo "usage: ./dev run [--chat-model PATH.gguf] [--chat-template FILE.jinja]" >&2; exit 2 ;;
  esac
done
if [ -n "${DUO_LOCAL_LLM_CHAT_MODEL:-}" ] && [ ! -f "$DUO_LOCAL_LLM_CHAT_MODEL" ]; then
  echo "duo: no chat model at $DUO_LOCAL_LLM_CHAT_MODEL" >&2
  exit 2
fi

RUN_DIR="${DUO_RUN_DIR:-$ROOT/.cache/run}"
mkdir -p "$RUN_DIR"
BIN="${DUO_RUN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}"
PIDS_FILE="$RUN_DIR/pids"
pids=()
started_pg=0

say() { echo "duo: $*" >&2; }

# The database of this run is stopped by postgres.sh, which must not take the
# DATABASE_URL this script exported for its services as an external server.
stop_database() {
  env -u DATABASE_URL scripts/postgres.sh stop >/dev/null 2>&1 || true
}

stop_all() {
  trap - INT TERM HUP EXIT
  if [ ${#pids[@]} -gt 0 ]; then
    say "stopping services"
    # Newest first: the monolith before the gateway before the model server.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  fi
  if [ "$started_pg" = 1 ]; then
    stop_database
  fi
  rm -f "$PIDS_FILE"
  say "stopped"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all; exit 129' HUP
trap stop_all EXIT

# What a run killed outright left behind: its services (only processes that
# still run one of our binaries) and, if it started it, the database.
if [ -f "$PIDS_FILE" ]; then
  say "cleaning up after an earlier run that did not stop"
  while read -r kind pid; do
    if [ "$kind" = pg ]; then
      stop_database
    elif [ -n "$pid" ] && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" == */duo-* ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done <"$PIDS_FILE"
  rm -f "$PIDS_FILE"
fi

# Polls an HTTP URL until it answers 2xx, or fails after $2 seconds.
wait_http() {
  local url="$1" limit="$2" name="$3" started=$SECONDS
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    if ((SECONDS - started > limit)); then
      say "$name did not become ready at $url within ${limit}s; its log: $RUN_DIR/$name.log"
      tail -n 20 "$RUN_DIR/$name.log" >&2 || true
      exit 1
    fi
    # A dead process will never answer: fail fast with its log.
    for pid in "${pids[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        say "a service exited early; last lines of $RUN_DIR/$name.log:"
        tail -n 20 "$RUN_DIR/$name.log" >&2 || true
        exit 1
      fi
    done
    sleep 0.2
  done
}

start() {
  local name="$1"
  shift
  "$@" >"$RUN_DIR/$name.log" 2>&1 &
  pids+=($!)
  echo "service $!" >>"$PIDS_FILE"
}

if [ -z "${DUO_RUN_BIN:-}" ]; then
  scripts/install-build-deps.sh
  say "building (release)"
  # In the background, so that a stop request during the build is handled at once.
  scripts/prune-llama-links.sh
  scripts/build-release.sh --bin duo-gateway --bin duo-monolith --bin duo-local-llm --bin duo-workflow-executor &
  build=$!
  wait "$build"
fi

if [ -z "${DATABASE_URL:-}" ]; then
  if ! scripts/postgres.sh status >/dev/null 2>&1; then
    started_pg=1
    echo "pg -" >>"$PIDS_FILE"
  fi
  eval "$(scripts/postgres.sh env)"
  scripts/postgres.sh psql -tAc "SELECT 1 FROM pg_database WHERE datname = 'duo'" | grep -q 1 ||
    scripts/postgres.sh psql -c "CREATE DATABASE duo" >/dev/null
  export DATABASE_URL="${DATABASE_URL%/*}/duo"
fi

export DUO_WEB_ADDR="${DUO_WEB_ADDR:-127.0.0.1:3000}"
# The projects' git repositories live beside the signing keys, in .duo/.
export DUO_REPOSITORIES_DIR="${DUO_REPOSITORIES_DIR:-$ROOT/.duo/repositories}"
export AIGW_GITLAB_URL="${AIGW_GITLAB_URL:-http://$DUO_WEB_ADDR}"
export AI_GATEWAY_URL="${AI_GATEWAY_URL:-http://127.0.0.1:5052}"
export AIGW_FASTAPI__API_PORT="${AIGW_FASTAPI__API_PORT:-${AI_GATEWAY_URL##*:}}"
# The Duo Workflow gRPC service runs inside the gateway on its own port.
export DUO_WORKFLOW_SERVICE_URL="${DUO_WORKFLOW_SERVICE_URL:-http://127.0.0.1:50052}"
export AIGW_WORKFLOW_SERVICE__LISTEN="${AIGW_WORKFLOW_SERVICE__LISTEN-${DUO_WORKFLOW_SERVICE_URL#*://}}"

# The bundled model server's address (DUO_LOCAL_LLM_ADDR, as the server itself
# reads it) is where the gateway sends chat, embeddings and Vertex calls.
export DUO_LOCAL_LLM_ADDR="${DUO_LOCAL_LLM_ADDR:-127.0.0.1:5053}"
export AIGW_LOCAL_LLM__URL="${AIGW_LOCAL_LLM__URL:-http://$DUO_LOCAL_LLM_ADDR/v1}"
export AIGW_VERTEX_TEXT_MODEL__ENDPOINT="${AIGW_VERTEX_TEXT_MODEL__ENDPOINT:-http://$DUO_LOCAL_LLM_ADDR}"

default_index_wait=0
if [ -z "${ANTHROPIC_API_KEY:-}${OPENAI_BASE_URL:-}" ]; then
  default_index_wait=600
  "$BIN/duo-local-llm" fetch-models
  start local-llm "$BIN/duo-local-llm" serve
  wait_http "http://$DUO_LOCAL_LLM_ADDR/health" 120 local-llm
fi

start gateway "$BIN/duo-gateway"
wait_http "$AI_GATEWAY_URL/monitoring/healthz" 60 gateway

"$BIN/duo-monolith" migrate >"$RUN_DIR/migrate.log" 2>&1
"$BIN/duo-monolith" seed --json >"$RUN_DIR/seed.json" 2>"$RUN_DIR/seed.log"
start web "$BIN/duo-monolith" web
start worker "$BIN/duo-monolith" worker
wait_http "http://$DUO_WEB_ADDR/.well-known/openid-configuration" 60 web

token="$(python3 -c '
import json, sys
users = json.load(open(sys.argv[1]))["users"]
best = next((u for u in users if u.get("duo_seat") and not u.get("admin")), users[0])
print(best["username"], best["token"])
' "$RUN_DIR/seed.json")"
logins="$(python3 -c '
import json, sys
for u in json.load(open(sys.argv[1]))["users"]:
    print("    %-8s %s   (%s)" % (u["username"], u["password"], u["note"]))
' "$RUN_DIR/seed.json")"
user="${token%% *}"
token="${token#* }"

# The repository examples need the code index: wait until every demo
# repository is indexed (or failed), with a progress line, before saying
# Duo is ready. DUO_RUN_INDEX_WAIT (seconds) bounds the wait: 600 with the
# bundled model server (it computes the embeddings), 0 (no wait) otherwise.
wait_indexed() {
  local limit="${DUO_RUN_INDEX_WAIT:-$default_index_wait}" started=$SECONDS status
  [ "$limit" -gt 0 ] || return 0
  while :; do
    status="$(curl -fsS "http://$DUO_WEB_ADDR/api/v4/projects?per_page=100" \
      -H "Authorization: Bearer $token" 2>/dev/null | python3 -c '
import json, sys
try:
    projects = json.load(sys.stdin)
except ValueError:
    print("unknown 0 0 0 -")
    sys.exit()
states = [p["code_index"] for p in projects if p.get("code_index")]
done = [s for s in states if s["state"] in ("ready", "failed")]
failed = [s.get("last_error_code") or "?" for s in states if s["state"] == "failed"]
chunks = sum(s.get("chunk_count") or 0 for s in states)
print("ok" if states and len(done) == len(states) else "wait", len(done), len(states), chunks, ",".join(failed) or "-")
' 2>/dev/null || echo "unknown 0 0 0 -")"
    read -r verdict done_count total chunks failed <<<"$status"
    if [ "$verdict" = ok ]; then
      printf '\r' >&2
      say "demo repositories indexed: $done_count of $total ($chunks chunks)"
      if [ "$failed" != - ]; then
        say "indexing failed for some repositories (error codes: $failed); see $RUN_DIR/worker.log"
      fi
      return 0
    fi
    if [ "$total" = 0 ] && ((SECONDS - started > 30)); then
      printf '\n' >&2
      say "no repository is queued for indexing (code search off?); not waiting for the index"
      return 0
    fi
    if ((SECONDS - started > limit)); then
      printf '\n' >&2
      say "the demo repositories are not indexed after ${limit}s ($done_count of $total); repository questions answer \"being indexed\" until they are. See $RUN_DIR/worker.log"
      return 0
    fi
    # A dead service will never index anything.
    for pid in "${pids[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        say "a service exited early; see the logs in $RUN_DIR"
        exit 1
      fi
    done
    printf '\rindexing the demo repositories: %s of %s done, %s chunks, %ss ' \
      "$done_count" "$total" "$chunks" "$((SECONDS - started))" >&2
    sleep 1
  done
}
wait_indexed

cat <<EOF

Duo Chat is running (logs in $RUN_DIR):
  web app    http://$DUO_WEB_ADDR/   (sign in with a demo user below)
  monolith   http://$DUO_WEB_ADDR   (GraphQL at /api/graphql)
  gateway    $AI_GATEWAY_URL
  workflows  $DUO_WORKFLOW_SERVICE_URL   (Duo Workflow gRPC service)
  database   $DATABASE_URL

Demo users (username, password):
$logins

Their personal access tokens are in $RUN_DIR/seed.json. Ask a question over the API as $user:

curl -s http://$DUO_WEB_ADDR/api/graphql -H 'Authorization: Bearer $token' -H 'Content-Type: application/json' \\
  -d '{"query":"mutation { aiAction(input: {chat: {content: \"What can you do?\"}}) { requestId threadId errors } }"}'

Clone a demo repository (alice owns acme; push works too):

git clone http://$user:$token@$DUO_WEB_ADDR/acme/platform/api.git

then read the answer to the question above:

curl -s http://$DUO_WEB_ADDR/api/graphql -H 'Authorization: Bearer $token' -H 'Content-Type: application/json' \\
  -d '{"query":"{ aiMessages { nodes { role content errors } } }"}'

Run a Duo Workflow on a checkout of project 1 (see docs/duo-workflow.md):

$BIN/duo-workflow-executor --gitlab-url http://$DUO_WEB_ADDR --token $token \\
  --project-id 1 --goal "Describe this repository in NOTES.md" --workspace /path/to/checkout

Press Ctrl-C to stop everything.
EOF

# Stay in the foreground until a service dies or the user interrupts.
wait -n "${pids[@]}" || true
say "a service exited; see the logs in $RUN_DIR"
exit 1
