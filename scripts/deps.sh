#!/bin/sh
# Installs the Debian packages shoal builds against, if any is missing.
# Safe to run repeatedly: it does nothing when everything is present.
set -eu
PKGS="build-essential pkg-config clang libclang-rt-14-dev
      libzstd-dev libxxhash-dev libucx-dev ucx-utils libmicrohttpd-dev libjansson-dev nettle-dev
      libopenblas-dev libsqlite3-dev libpq-dev postgresql libcmocka-dev
      bubblewrap libseccomp-dev runsc chromium e2fsprogs
      python3 python3-torch python3-numpy python3-venv python3-pip python3-setuptools"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# The dashboard's browser test drives Debian's chromium with playwright-core
# (pinned in tests/browser/package-lock.json).
browser_deps() {
    [ -d tests/browser/node_modules/playwright-core ] && return 0
    command -v npm >/dev/null 2>&1 || return 0
    (cd tests/browser && npm ci --no-audit --no-fund >/dev/null 2>&1) ||
        echo "deps.sh: npm ci in tests/browser failed; the dashboard test will be skipped" >&2
}
[ -z "$missing" ] && { browser_deps; echo "deps.sh: every package shoal needs is installed" >&2; exit 0; }
echo "deps.sh: installing:$missing" >&2
if [ "$(id -u)" -ne 0 ]; then
    echo "deps.sh: missing packages and not root; run: sudo apt-get install$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
browser_deps
