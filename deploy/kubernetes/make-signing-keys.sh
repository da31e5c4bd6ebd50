#!/usr/bin/env bash
# Makes (or extends) a directory of monolith keys for the `duo-signing-keys`
# Secret, which web and worker pods mount read-only at DUO_SIGNING_KEY_DIR:
#
#   <created-at>-<random>.pem   an RS256 signing key (PKCS#8 PEM, 2048 bits);
#                               the newest signs, all are published in the JWKS
#   secrets.key                 32 random bytes sealing stored provider API keys;
#                               made once and never changed (back it up)
#
#   deploy/kubernetes/make-signing-keys.sh DIR      add a signing key to DIR
#   kubectl -n duo-chat create secret generic duo-signing-keys --from-file=DIR \
#     --dry-run=client -o yaml | kubectl apply -f -
#
# Running it again on the same directory adds a newer key (rotation, see
# deploy/README.md); the older keys stay until you delete their files.
set -euo pipefail

dir="${1:?usage: make-signing-keys.sh DIR}"
command -v openssl >/dev/null 2>&1 || { echo "make-signing-keys.sh: openssl is needed" >&2; exit 2; }
umask 077
mkdir -p "$dir"

if [ ! -e "$dir/secrets.key" ]; then
  openssl rand -out "$dir/secrets.key" 32
fi

# Names sort in signing order: zero-padded creation time, strictly after the
# newest key already there (as duo-monolith rotate-keys names them).
created="$(date +%s)"
newest="$(find "$dir" -maxdepth 1 -name '*.pem' -printf '%f\n' | sort | tail -n 1 | cut -d- -f1)"
if [ -n "$newest" ] && [ "$((10#$newest))" -ge "$created" ]; then
  created=$((10#$newest + 1))
fi
kid="$(printf '%012d' "$created")-$(openssl rand -hex 4)"
openssl genpkey -quiet -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$dir/$kid.pem"
echo "$kid"
