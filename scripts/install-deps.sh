#!/bin/sh
# Installs the Debian packages tandem needs to build and test, and nothing when they are all present.
# Usage: scripts/install-deps.sh        (called by `make run` and `make test`)
set -eu
PACKAGES="build-essential cmake pkg-config git libjansson-dev libyaml-dev libpcre2-dev libutf8proc-dev
libopenblas-openmp-dev libcmocka-dev spin clang libclang-rt-dev python3 openssh-client openssh-server rsync npm
iproute2 procps util-linux jq
slurm-wlm slurmctld slurmd slurm-client munge"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
# npm may come from a Node.js install that is not a Debian package; accept it when on PATH.
case " $missing " in *" npm "*) command -v npm >/dev/null 2>&1 && missing=$(echo "$missing" | sed 's/ npm//') ;; esac
# Optional: wanted by tests, not by the build. A system where one cannot be installed (Ubuntu ships
# chromium only as a snap) still builds and tests; the test that needs it skips and says why.
#   chromium   the headless browser integration.report renders `tandem report`'s page in
OPTIONAL="chromium"
optional=""
for p in $OPTIONAL; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || optional="$optional $p"
done
[ -z "$missing" ] && [ -z "$optional" ] && exit 0

echo "install-deps: installing:$missing$optional" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; elif [ -z "$missing" ]; then
        echo "install-deps: not installing the optional$optional (needs root or sudo)" >&2; exit 0
    else
        echo "install-deps: need root (or sudo) to install:$missing" >&2; exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Slurm and munge are for the tests, which start their own daemons under a temporary directory
# (tests/lib/slurm.sh): installing must start none. Debian's policy-rc.d hook (exit 101) stops
# package scripts from starting services; put one in place for this install when there is none.
rc_policy_added=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    rc_policy_added=1
fi
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
for p in $optional; do
    $SUDO apt-get install -y -qq --no-install-recommends "$p" ||
        echo "install-deps: could not install $p (optional: the tests that need it skip)" >&2
done
[ -z "$rc_policy_added" ] || $SUDO rm -f /usr/sbin/policy-rc.d
