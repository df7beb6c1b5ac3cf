#!/bin/sh
# Installs the Debian packages tandem needs to build and test, and nothing when they are all present.
# Usage: scripts/install-deps.sh        (called by `make run` and `make test`)
set -eu
PACKAGES="build-essential cmake pkg-config git libjansson-dev libyaml-dev libpcre2-dev libutf8proc-dev
libopenblas-dev libcmocka-dev spin clang libclang-rt-dev python3 openssh-client openssh-server rsync npm
iproute2 procps util-linux jq"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
# npm may come from a Node.js install that is not a Debian package; accept it when on PATH.
case " $missing " in *" npm "*) command -v npm >/dev/null 2>&1 && missing=$(echo "$missing" | sed 's/ npm//') ;; esac
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install-deps: need root (or sudo) to install:$missing" >&2; exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
