#!/usr/bin/env bash
# The embedding reference of `./dev bench code-search`: ONNX Runtime (CPU)
# running the same MiniLM weights as duo-local-llm, in a cached virtual
# environment with pinned packages (no PyTorch: the graph is written from the
# safetensors by scripts/embed_reference.py).
#
#   scripts/embed-reference.sh MODEL_DIR IN.json OUT.json
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.cache/embed-reference"
# Bump the stamp when the pinned set changes: the environment is rebuilt.
PACKAGES=(onnxruntime==1.31.1 onnx==1.23.2 numpy==2.4.6 tokenizers==0.23.3 safetensors==0.8.0)
STAMP="$VENV/.packages-$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"

if ! [ -f "$STAMP" ] || ! [ -x "$VENV/bin/python" ]; then
  echo "embed-reference.sh: installing ${PACKAGES[*]} into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
  touch "$STAMP"
fi
exec "$VENV/bin/python" "$ROOT/scripts/embed_reference.py" "$@"
