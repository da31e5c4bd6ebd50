#!/usr/bin/env bash
# Fetches the bundled models' weights into DUO_MODELS_DIR (default .models/).
# Does nothing when they are already there with the right checksums.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --release --quiet -p local-llm --bin duo-local-llm -- fetch-models
