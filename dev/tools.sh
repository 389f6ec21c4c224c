#!/usr/bin/env bash
# Makes sure the named commands exist: installs the Debian/Ubuntu package of each missing
# one with apt-get when run as root, otherwise names the packages and fails.
#   dev/tools.sh nginx chromium node npm
set -euo pipefail

package_of() {
  case $1 in
    nginx) echo nginx ;;
    chromium) echo chromium ;;
    node) echo nodejs ;;
    *) echo "$1" ;;
  esac
}

missing=()
for tool in "$@"; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || missing+=("$(package_of "$tool")")
done
((${#missing[@]})) || exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  printf '\033[1m[tools]\033[0m installing %s\n' "${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  printf '\033[1;31m[tools]\033[0m missing: %s — sudo apt-get install %s\n' \
    "${missing[*]}" "${missing[*]}" >&2
  exit 1
fi
