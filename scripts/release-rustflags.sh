#!/usr/bin/env bash
# Prints the RUSTFLAGS for a release build: the caller's own, plus the
# recorded profile of the gateway (`pgo/duo-gateway.profdata.gz`, made by
# `./dev pgo`) for profile-guided optimisation. Every release build of the
# project (`./dev run`, `./dev bench`, `./dev eval`, the container image)
# takes its flags from here, so they all share one set of compiled crates.
#
# The profile is unpacked to a file named after its content: cargo compares
# the flags' text, not the file behind them, so a new profile must change
# the text for the crates to be compiled with it.
set -euo pipefail
cd "$(dirname "$0")/.."
flags="${RUSTFLAGS:-}"
packed=pgo/duo-gateway.profdata.gz
if [ -f "$packed" ] && [ "${DUO_PGO:-on}" != off ]; then
  digest=$(sha256sum "$packed" | cut -c1-16)
  target="${CARGO_TARGET_DIR:-$PWD/target}"
  case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
  unpacked="$target/pgo/duo-gateway-$digest.profdata"
  if [ ! -f "$unpacked" ]; then
    mkdir -p "$target/pgo"
    gzip -dc "$packed" > "$unpacked.partial"
    mv "$unpacked.partial" "$unpacked"
  fi
  flags="$flags -Cprofile-use=$unpacked"
fi
printf '%s\n' "${flags# }"
