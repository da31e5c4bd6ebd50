#!/usr/bin/env bash
# Builds the gateway and the bench in release mode, then runs the bench
# (what `./dev bench` should run). Extra arguments go to duo-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin duo-gateway --bin duo-bench
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/duo-bench" "$@"
