#!/bin/sh
# Install what gpumemd needs to build and test on Debian 12 (as root); does nothing when all is present.
set -eu
pkgs="meson ninja-build pkg-config gcc clang libc6-dev libevent-dev libsystemd-dev libprotobuf-c-dev
      protobuf-c-compiler libnuma-dev libdrm-dev libinih-dev python3 binutils systemd
      scdoc python3-yaml libjson-c-dev libsmartcols-dev python3-jsonschema liburing-dev"
# systemd-nspawn, which boots Debian's systemd as PID 1 of a container for the tests of the units (test_pid1.py).
pkgs="$pkgs systemd-container"
# Debian's ROCm 5.2.3 user space, which tests/rocm runs unmodified on the KFD model.
pkgs="$pkgs libhsakmt1 libhsakmt-dev libhsa-runtime64-1 rocminfo libamdhip64-5 libamdhip64-dev"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "gpumemd: missing packages:$missing (run as root to install them)" >&2
        exit 1
    fi
    echo "gpumemd: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# promtool, Prometheus's linter, which the metrics test runs over a live scrape. Only the one binary is
# taken out of Debian's prometheus package: installing the package would also set up and start a Prometheus
# server, which a build machine has no use for.
if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "gpumemd: missing promtool (run as root to install it from Debian's prometheus package)" >&2
        exit 1
    fi
    tmp=$(mktemp -d)
    if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
        apt-get update -qq
        (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1)
    fi
    # into place only once whole: a failed extraction must not leave an empty promtool behind
    dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xO ./usr/bin/promtool >"$tmp/promtool"
    [ -s "$tmp/promtool" ] || { echo "gpumemd: no promtool in Debian's prometheus package" >&2; exit 1; }
    install -m 755 "$tmp/promtool" /usr/local/bin/promtool
    rm -rf "$tmp"
    echo "gpumemd: installed promtool from Debian's prometheus package"
fi
