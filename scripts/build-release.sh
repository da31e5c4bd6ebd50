#!/usr/bin/env bash
# `scripts/build-release.sh [cargo build arguments]`: the project's release
# build. Every release build goes through here (`./dev run`, `./dev bench`,
# `./dev eval`, the container image) so that all of them use the same flags
# (scripts/release-rustflags.sh: the gateway's recorded profile) and build
# the gateway the same way.
#
# The gateway is built on its own, before the rest: built together with
# other packages, cargo merges their dependencies' features into its
# dependencies, so its code would differ from the code its profile was
# recorded on (scripts/pgo.sh builds it on its own too), and the profile
# would fit only in part (measured: a gateway built beside the bench kept a
# third of the profile's gain; docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
flags="$(scripts/release-rustflags.sh)"
gateway=0
rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    -p|--package|--bin)
      [ $# -ge 2 ] || { echo "build-release: $1 needs a value" >&2; exit 2; }
      if [ "$2" = gateway ] || [ "$2" = duo-gateway ]; then gateway=1; else rest+=("$1" "$2"); fi
      shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
if [ "$gateway" = 1 ]; then
  RUSTFLAGS="$flags" cargo build --release --locked -p gateway --bin duo-gateway
fi
if [ "${#rest[@]}" -gt 0 ]; then
  RUSTFLAGS="$flags" cargo build --release --locked "${rest[@]}"
fi
