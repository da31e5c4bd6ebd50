#!/usr/bin/env bash
# A cached virtual environment with the Python packages the tests use, pinned:
# GitLab's own REST client (python-gitlab); the Kubernetes API schemas
# (kubernetes-validate, which carries them, so it works offline) and the
# Compose Specification schema (check-jsonschema's vendored copy) for the
# deployment manifests; the official MCP SDK (mcp), as the client of our MCP
# server and the server our MCP client calls. Prints the interpreter's path.
#
#   scripts/python-env.sh   create or reuse .cache/python-env, print .../bin/python
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.cache/python-env"
# Bump the stamp when the pinned set changes: the environment is rebuilt.
PACKAGES=(python-gitlab==8.6.0 kubernetes-validate==1.37.0 check-jsonschema==0.39.0 mcp==2.3.0)
STAMP="$VENV/.packages-$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"

if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
echo "python-env.sh: installing ${PACKAGES[*]} into $VENV" >&2
rm -rf "$VENV"
python3 -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
touch "$STAMP"
echo "$VENV/bin/python"
