#!/usr/bin/env bash
# `./dev pgo`: records the profile that the release build of the gateway is
# optimised with (profile-guided optimisation, docs/performance.md), into
# `pgo/duo-gateway.profdata.gz`. Run it after changes to the gateway's hot
# path and commit the new profile; a profile older than the code still
# applies to every function that did not change.
#
# 1. An instrumented gateway (`-Cprofile-generate`), in a target directory of
#    its own: its flags differ from every other build's.
# 2. `duo-bench --train-profile` (built in the same directory, instrumented
#    too, which costs nothing at this load) sends it each bench target's calls, against the fake provider, and stops
#    it with SIGTERM so that it writes its counts.
# 3. llvm-profdata (rustup's `llvm-tools` component, the toolchain's own LLVM)
#    merges them; `--sparse` leaves out what never ran, so code the training
#    did not reach is optimised as without a profile rather than as cold
#    (measured against a full profile: the same CPU per request, and a file
#    of 0.4 MB instead of 3 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work="$root/target/pgo-train"
counts="$work/counts"

find_tool() { find "$(rustc --print sysroot)" -name llvm-profdata -type f 2>/dev/null | head -n1; }
tool=$(find_tool)
if [ -z "$tool" ]; then
  rustup component add llvm-tools
  tool=$(find_tool)
fi
[ -n "$tool" ] || { echo "pgo: llvm-profdata not found (rustup component add llvm-tools)" >&2; exit 1; }

rm -rf "$counts"
mkdir -p "$counts"
echo "pgo: building the instrumented gateway, then the bench"
# The gateway on its own, as scripts/build-release.sh builds it: with the
# same features its dependencies' code is the same, and the profile fits.
RUSTFLAGS="-Cprofile-generate=$counts" CARGO_TARGET_DIR="$work/target" \
  cargo build --release --locked -p gateway --bin duo-gateway
RUSTFLAGS="-Cprofile-generate=$counts" CARGO_TARGET_DIR="$work/target" \
  cargo build --release --locked -p bench --bin duo-bench
# Build scripts, proc macros and the bench write counts of their own into
# $counts (as default_*.profraw); only the gateways' files are merged.
rm -f "$counts"/*.profraw
echo "pgo: training"
DUO_TRAIN_PROFILE_FILE="$counts/duo-gateway-%p-%m.profraw" \
DUO_BENCH_GATEWAY="$work/target/release/duo-gateway" \
  "$work/target/release/duo-bench" --train-profile
"$tool" merge --sparse -o "$work/duo-gateway.profdata" "$counts"/duo-gateway-*.profraw
mkdir -p pgo
gzip -9 -n -c "$work/duo-gateway.profdata" > pgo/duo-gateway.profdata.gz
echo "pgo: wrote pgo/duo-gateway.profdata.gz ($(wc -c < pgo/duo-gateway.profdata.gz) bytes); the next release build uses it"
