#!/usr/bin/env bash
# llama-cpp-sys-2 links its shared libraries' names (`libllama.so`,
# `libggml*.so`: symlinks to `*.so.0`) into target/<profile>/ and deps/,
# where they dangle, and its build script fails ("File exists") when a
# later build of it (another package selection gives it another hash) finds
# such a dangling name. The binaries do not use them (their run path points
# at llama-cpp-sys-2's own output, crates/local-llm/build.rs), so dangling
# ones are removed before each build.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
[ -d "$target" ] || exit 0
find "$target" -maxdepth 3 -xtype l \( -name 'libllama*.so*' -o -name 'libggml*.so*' \) -delete
