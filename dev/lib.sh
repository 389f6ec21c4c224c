# What the scripts of dev/ and loadtest/ share (sourced, after `set -euo pipefail`):
# their messages, waiting for a port or a URL, installing Debian packages, and calling the
# operators' API.

# How a sale's Redis keeps small hashes and sorted sets (docs/deployment.md, "Running it in
# production"; docker-compose.yml says the same): as hash tables and skip lists from the
# 17th entry on, not as lists scanned entry by entry up to the 128th. Every Redis the
# scripts start for a sale, or to measure one, runs with these.
REDIS_SALE_SETTINGS=(--hash-max-listpack-entries 16 --zset-max-listpack-entries 16)

# Messages are prefixed with the script's name, without `.sh`.
lib_tag=$(basename "$0" .sh)

log() { printf '\033[1m[%s]\033[0m %s\n' "$lib_tag" "$*" >&2; }
die() {
  printf '\033[1;31m[%s]\033[0m %s\n' "$lib_tag" "$*" >&2
  exit 1
}

# answers PORT [HOST]: whether something accepts TCP connections there (loopback by default).
answers() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

# wait_port NAME PORT SECONDS [HOST]: until the port answers; fails naming NAME otherwise.
wait_port() {
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    answers "$2" "${4:-127.0.0.1}" && return 0
    sleep 0.2
  done
  die "$1 did not start listening on ${4:-127.0.0.1}:$2 within $3 s (see its log)"
}

# wait_http URL [SECONDS] [PID]: until the URL answers 2xx (60 s by default: a server under
# valgrind starts slowly); fails at once if process PID, the server, has exited.
wait_http() {
  local i
  for ((i = 0; i < ${2:-60} * 5; i++)); do
    curl -fs "$1" >/dev/null && return 0
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      die "the server exited before $1 answered; see its log"
    fi
    sleep 0.2
  done
  die "no answer from $1 within ${2:-60} s"
}

# wait_until SECONDS COMMAND...: until COMMAND succeeds (its output discarded), checked
# every 0.2 s; returns 1 if it never did.
wait_until() {
  local i limit=$1
  shift
  for ((i = 0; i < limit * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# can_install: whether apt_install can work here (root on Debian/Ubuntu).
can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

# apt_install PACKAGE...: installs them quietly (apt-get update once per script), or fails
# naming them when this is not root on Debian/Ubuntu.
lib_apt_updated=
apt_install() {
  can_install || die "missing: $* — sudo apt-get install $*"
  if [ -z "$lib_apt_updated" ]; then
    log "apt-get update"
    apt-get update -qq
    lib_apt_updated=1
  fi
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# admin METHOD PATH [JSON]: the operators' API of the server at ${at:-$api}, with
# $SECKILL_ADMIN_TOKEN; prints the answer's body (curl's options in a caller's
# `admin_curl` array come first).
admin_curl=()
admin() {
  curl -fsS "${admin_curl[@]}" -X "$1" "${at:-$api}$2" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
    -H 'Content-Type: application/json' ${3:+-d "$3"}
}
