#!/usr/bin/env bash
# Makes sure Redis, MariaDB and RabbitMQ answer on loopback at their standard ports.
# For each one that does not: start it if it is installed; install it with apt first when
# it is missing and this runs as root on Debian/Ubuntu; otherwise say exactly what is
# missing and how to get it, and fail. Also checks the tools the scripts need.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

missing=()
need() { # command debian-package
  command -v "$1" >/dev/null && return 0
  if can_install; then apt_install "$2"; else missing+=("$2 (for $1)"); fi
}

start_redis() {
  local dir=/var/lib/redis logfile=/var/log/redis/ci.log
  [ -w "$dir" ] || dir=$(mktemp -d)
  [ -w "$(dirname "$logfile")" ] || logfile="$dir/redis.log"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    "${REDIS_SALE_SETTINGS[@]}" --dir "$dir" --logfile "$logfile"
}

start_mariadb() {
  if [ "$(id -u)" = 0 ]; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  else
    die "MariaDB is installed but not running, and starting it needs root: sudo service mariadb start"
  fi
}

start_rabbitmq() {
  if [ "$(id -u)" = 0 ] || [ -w /var/lib/rabbitmq ]; then
    rabbitmq-server -detached
  else
    die "RabbitMQ is installed but not running, and starting it needs root: sudo service rabbitmq-server start"
  fi
}

ensure() { # name port binary debian-package start-function wait-seconds
  local name=$1 port=$2 binary=$3 package=$4 start=$5 seconds=$6
  if answers "$port"; then
    log "$name answers on 127.0.0.1:$port"
    return 0
  fi
  if ! command -v "$binary" >/dev/null && [ ! -x "/usr/sbin/$binary" ]; then
    if can_install; then
      apt_install "$package"
      installed+=("$name")
      # Debian starts a freshly installed service by itself when it can.
      sleep 1
      answers "$port" && { log "$name installed and running"; return 0; }
    else
      missing+=("$package (for $name)")
      return 0
    fi
  fi
  log "starting $name"
  "$start"
  wait_port "$name" "$port" "$seconds"
  log "$name started on 127.0.0.1:$port"
}

installed=()
need curl curl
ensure Redis 6379 redis-server redis-server start_redis 20
ensure MariaDB 3306 mariadbd mariadb-server start_mariadb 60
ensure RabbitMQ 5672 rabbitmq-server rabbitmq-server start_rabbitmq 90

if ((${#missing[@]})); then
  die "missing: ${missing[*]}
  On Debian/Ubuntu: sudo apt-get install ${missing[*]%% *}  (or run this script as root)
  Elsewhere: run Redis, MariaDB and RabbitMQ on their standard ports, or start them with
  docker compose up redis mariadb rabbitmq, or point SECKILL_REDIS_URL,
  SECKILL_DATABASE_URL and SECKILL_AMQP_URL at yours."
fi

# The default SECKILL_DATABASE_URL logs in as root without a password over TCP. A fresh
# Debian MariaDB lets root in only through its socket; allow TCP too, but only on a
# MariaDB this script has just installed (a dev box), never on one it found.
if command -v mariadb >/dev/null && ! mariadb -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1; then
  if [[ " ${installed[*]} " == *" MariaDB "* ]]; then
    log "letting root log in over TCP without a password (fresh dev install)"
    mariadb -u root -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
  else
    log "note: root cannot log in to MariaDB over TCP without a password; set SECKILL_DATABASE_URL (mysql://user:password@127.0.0.1:3306/seckill)"
  fi
fi

command -v cargo >/dev/null || die "cargo is missing: install Rust 1.94 or newer (https://rustup.rs)"
log "all services answer"
