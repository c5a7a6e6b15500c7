#!/usr/bin/env bash
# Installs the Debian packages pinned in debian-packages.txt (beside this script),
# each at its pinned version. A no-op when every one is already installed at it;
# otherwise one `apt-get update`, then one `apt-get install -y name=version ...`.
# Needs root (as the machines that run the tier are).
#
# Usage: tests/k8s/build/install-node-packages.sh [--check]
#   --check: install nothing; exit 1 listing what is missing or at another version
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIST=${UERL_DEBIAN_PACKAGES:-$HERE/debian-packages.txt}

CHECK=0
case ${1:-} in
  --check) CHECK=1 ;;
  "") ;;
  *) sed -n '2,/^set /{/^#/p}' "$0"; exit 2 ;;
esac

wanted=()
while read -r line; do
  line=${line%%#*}
  line=${line//[[:space:]]/}
  [[ -n $line ]] || continue
  [[ $line == *=* ]] || { echo "$LIST: '$line' is not name=version" >&2; exit 2; }
  wanted+=("$line")
done <"$LIST"

missing=()
for spec in "${wanted[@]}"; do
  name=${spec%%=*}
  version=${spec#*=}
  have=$(dpkg-query -W -f '${Status} ${Version}' "$name" 2>/dev/null || true)
  [[ $have == "install ok installed $version" ]] || missing+=("$spec")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-node-packages: all ${#wanted[@]} packages installed at their pinned versions"
  exit 0
fi
if [[ $CHECK == 1 ]]; then
  echo "install-node-packages: missing or at another version: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Waits for a dpkg lock another apt client holds rather than failing at once.
APT=(apt-get -o DPkg::Lock::Timeout=600)
"${APT[@]}" update -qq
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}"
echo "install-node-packages: installed ${missing[*]}"
