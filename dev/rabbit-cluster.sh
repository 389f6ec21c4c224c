#!/usr/bin/env bash
# A local 3-node RabbitMQ cluster for trying the server on one: AMQP on 127.0.0.1:5701-5703
# (Erlang distribution on 25701-25703), node names seckill-570N@localhost, data in
# target/rabbit-cluster. Runs until Ctrl-C, which stops the three nodes. Then, in another
# terminal:
#   SECKILL_AMQP_URL=amqp://guest:guest@127.0.0.1:5701/%2f,amqp://guest:guest@127.0.0.1:5702/%2f,amqp://guest:guest@127.0.0.1:5703/%2f \
#   SECKILL_QUEUE_TYPE=quorum target/release/seckill serve
# Needs root (the nodes run as the rabbitmq user, as Debian's package sets them up).
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh
command -v rabbitmq-server >/dev/null || die "rabbitmq-server is missing: sudo apt-get install rabbitmq-server"
dir=$(pwd)/target/rabbit-cluster
ports=(5701 5702 5703)
rm -rf "$dir"
nodes=()
stop() {
  for node in "${nodes[@]}"; do rabbitmqctl -q -n "$node" stop >/dev/null 2>&1 || true; done
}
trap stop EXIT INT TERM
for port in "${ports[@]}"; do
  node=seckill-$port@localhost
  mkdir -p "$dir/$port"
  printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\n' "$port" >"$dir/$port/rabbitmq.conf"
  echo '[].' >"$dir/$port/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$dir/$port"
  RABBITMQ_NODENAME=$node RABBITMQ_CONFIG_FILE=$dir/$port/rabbitmq.conf \
    RABBITMQ_ENABLED_PLUGINS_FILE=$dir/$port/enabled_plugins RABBITMQ_DIST_PORT=$((port + 20000)) \
    RABBITMQ_MNESIA_BASE=$dir/$port/mnesia RABBITMQ_LOG_BASE=$dir/$port/log \
    rabbitmq-server -detached
  nodes+=("$node")
  # One after the other: three Erlang VMs booting at once starve a small machine. Booted
  # once its AMQP port answers.
  wait_port "$node (log: $dir/$port/log)" "$port" 120
done
for node in "${nodes[@]:1}"; do
  # A join cut short leaves the node half-joined: reset it and try again.
  for try in $(seq 5); do
    rabbitmqctl -q -n "$node" stop_app
    rabbitmqctl -q -n "$node" reset >/dev/null 2>&1
    rabbitmqctl -q -n "$node" join_cluster "${nodes[0]}" && break
    [ "$try" = 5 ] && die "$node could not join ${nodes[0]}"
    sleep 2
  done
  rabbitmqctl -q -n "$node" start_app
done
echo "running nodes:" >&2
rabbitmqctl -q -n "${nodes[0]}" cluster_status | awk '/Running Nodes/ {on = 1; next} /Versions/ {on = 0} on && NF' >&2
cat >&2 <<MSG
RabbitMQ cluster up: ${nodes[*]} (AMQP on 127.0.0.1:${ports[0]}-${ports[2]}, data in $dir).

  SECKILL_AMQP_URL=amqp://guest:guest@127.0.0.1:5701/%2f,amqp://guest:guest@127.0.0.1:5702/%2f,amqp://guest:guest@127.0.0.1:5703/%2f \\
  SECKILL_QUEUE_TYPE=quorum target/release/seckill serve

Ctrl-C stops it.
MSG
while true; do sleep 3600; done
