# Shared by the load-test scripts (sourced): waiting for a server, and leaving no trace of
# a run's namespace in the machine's MariaDB, Redis and RabbitMQ.

# wait_http URL: until it answers 2xx (about 60 s; valgrind'd servers start slowly).
wait_http() {
  for _ in $(seq 300); do curl -fs "$1" >/dev/null && return 0; sleep 0.2; done
  echo "no answer from $1" >&2
  exit 1
}

# forget NAMESPACE [REDIS_PATTERN...]: drops its database, its Redis keys (and those of
# the extra patterns) and its order queues.
forget() {
  local ns=$1 pattern
  shift
  mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS \`$ns\`" 2>/dev/null || true
  for pattern in "$ns:*" "$@"; do
    redis-cli --scan --pattern "$pattern" | xargs -r -n 1000 redis-cli del >/dev/null || true
  done
  if command -v rabbitmqctl >/dev/null; then
    for q in "$ns.orders" "$ns.orders.dead"; do rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true; done
  fi
}

# on_sale ID TOTAL: puts the item on sale from a minute ago for a day and loads its units
# (through the script's own `admin`).
on_sale() {
  local start end
  start=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
  end=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
  admin PUT "/admin/items/$1" "{\"name\":\"load test $1\",\"shop_id\":1,\"total\":$2,\"start_at\":\"$start\",\"end_at\":\"$end\",\"price_cents\":1}" >/dev/null
  admin POST "/admin/items/$1/warmup" >/dev/null
}
