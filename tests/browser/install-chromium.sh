#!/bin/sh
# Installs Debian's chromium for the browser tests (tests/browser), unless one is
# already on PATH. `make test` runs it; CI starts from a clean machine.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo -n "$0" "$@"
    fi
    echo "chromium is not installed and this is not root: apt-get install chromium" >&2
    exit 1
fi
echo "installing chromium (Debian's package) for the browser tests"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# fonts-liberation: metric-compatible fonts, so the page renders text, not boxes.
apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
command -v chromium >/dev/null
