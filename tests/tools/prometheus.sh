#!/usr/bin/env bash
# A real Prometheus for the tests, without a Go build: Debian bookworm's `prometheus`
# package at its pinned version, fetched with `apt-get download` (never installed: its
# postinst would start a daemon) and unpacked with `dpkg-deb -x` into a cache outside the
# work tree:
#
#   ${UERL_PROMETHEUS_CACHE:-$HOME/.cache/uerl-prometheus}/<version>/usr/bin/{prometheus,promtool}
#
# A complete cache is reused, so a second run is a no-op. Nothing is downloaded but that
# one package, through apt's own sources (one `apt-get update` first only when apt has no
# list to find it in). Prints the path of the `prometheus` binary (`promtool` is beside it).
#
# Usage: tests/tools/prometheus.sh [--print-cache]
set -euo pipefail

VERSION=2.42.0+ds-5+deb12u1
CACHE=${UERL_PROMETHEUS_CACHE:-$HOME/.cache/uerl-prometheus}
DEST=$CACHE/$VERSION
BIN=$DEST/usr/bin/prometheus

case ${1:-} in
  --print-cache) echo "$CACHE"; exit 0 ;;
  "") ;;
  *) sed -n '2,/^set /{/^#/p}' "$0" >&2; exit 2 ;;
esac

say() { echo "prometheus.sh: $*" >&2; }

works() { # the unpacked binaries run here
  "$BIN" --version >/dev/null 2>&1 && "$DEST/usr/bin/promtool" --version >/dev/null 2>&1
}

if [[ -e $DEST/.complete ]] && works; then
  echo "$BIN"
  exit 0
fi

for tool in apt-get dpkg-deb flock; do
  command -v "$tool" >/dev/null || {
    say "needs $tool (Debian's prometheus $VERSION is fetched with apt); none on this machine"
    exit 1
  }
done

mkdir -p "$CACHE"
# One fetch at a time (two pytest workers may ask at once); the second finds it done.
exec 9>"$CACHE/.lock"
flock 9
if [[ -e $DEST/.complete ]] && works; then
  echo "$BIN"
  exit 0
fi
tmp=$(mktemp -d "$CACHE/.tmp-$VERSION.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# apt's _apt user may not write here; apt then downloads as this user and says so.
download() { (cd "$tmp" && apt-get download -qq "prometheus=$VERSION" 2>"$tmp/apt.err") }
if ! download; then
  # Only for want of lists (a fresh machine or container): update them once, then retry.
  if grep -q "Unable to locate package\|Can't select\|Version .* was not found" "$tmp/apt.err"; then
    say "apt has no list with prometheus=$VERSION: apt-get update, then again"
    apt-get update -qq
    download || { cat "$tmp/apt.err" >&2; exit 1; }
  else
    cat "$tmp/apt.err" >&2
    exit 1
  fi
fi
deb=("$tmp"/prometheus_*.deb)
mkdir -p "$tmp/root"
dpkg-deb -x "${deb[0]}" "$tmp/root"
rm -rf "$DEST"
mv "$tmp/root" "$DEST"
if ! works; then
  say "the unpacked $BIN does not run here: $("$BIN" --version 2>&1 | head -1)"
  exit 1
fi
touch "$DEST/.complete"
say "Debian's prometheus $VERSION in $DEST"
echo "$BIN"
