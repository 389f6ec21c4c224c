#!/usr/bin/env bash
# A local 3-node RabbitMQ cluster, and the one definition of a node and of joining one
# that the tests use too. Needs root (the nodes run as the rabbitmq user, as Debian's
# package sets them up).
#
#   dev/rabbit-cluster.sh
#       AMQP on 127.0.0.1:5701-5703 (Erlang distribution on 25701-25703), node names
#       seckill-570N@localhost, data in target/rabbit-cluster. Runs until Ctrl-C, which
#       stops the three nodes. Then, in another terminal:
#         SECKILL_AMQP_URL=amqp://guest:guest@127.0.0.1:5701/%2f,amqp://guest:guest@127.0.0.1:5702/%2f,amqp://guest:guest@127.0.0.1:5703/%2f \
#         SECKILL_QUEUE_TYPE=quorum target/release/seckill serve
#   dev/rabbit-cluster.sh node DIR NODE IP:PORT [DIST_PORT]
#       starts one node (detached) named NODE, AMQP on IP:PORT, its config, data and logs in
#       DIR; returns at once (wait for its port)
#   dev/rabbit-cluster.sh join NODE SEED
#       joins the running NODE to SEED's cluster
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh
command -v rabbitmq-server >/dev/null || die "rabbitmq-server is missing: sudo apt-get install rabbitmq-server"

# A node pauses when it sees only a minority of the cluster (a partitioned node stops
# serving rather than diverge). On an address other than loopback it does not read
# Debian's rabbitmq-env.conf, which keeps epmd and the distribution port on loopback,
# where no other host reaches them.
node() { # DIR NODE IP:PORT [DIST_PORT]
  local dir=$1 name=$2 listen=$3 dist=${4:-}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  printf 'listeners.tcp.1 = %s\nloopback_users = none\ncluster_partition_handling = pause_minority\n' \
    "$listen" >"$dir/rabbitmq.conf"
  echo '[].' >"$dir/enabled_plugins"
  : >"$dir/rabbitmq-env.conf"
  chown -R rabbitmq:rabbitmq "$dir"
  local env=(RABBITMQ_NODENAME="$name" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log")
  [ -n "$dist" ] && env+=(RABBITMQ_DIST_PORT="$dist")
  [ "${listen%:*}" = 127.0.0.1 ] || env+=(RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf")
  env "${env[@]}" rabbitmq-server -detached >/dev/null
}

join() { # NODE SEED
  local name=$1 seed=$2 try
  # A join cut short leaves the node half-joined: reset it and try again.
  for try in $(seq 5); do
    rabbitmqctl -q -n "$name" stop_app
    rabbitmqctl -q -n "$name" reset >/dev/null 2>&1
    rabbitmqctl -q -n "$name" join_cluster "$seed" && break
    [ "$try" = 5 ] && die "$name could not join $seed"
    sleep 2
  done
  rabbitmqctl -q -n "$name" start_app
}

case "${1:-}" in
  node) shift && node "$@" && exit ;;
  join) shift && join "$@" && exit ;;
  "") ;;
  *) die "usage: $0 [node DIR NODE IP:PORT [DIST_PORT] | join NODE SEED]" ;;
esac

dir=$(pwd)/target/rabbit-cluster
ports=(5701 5702 5703)
rm -rf "$dir"
nodes=()
stop() {
  for node in "${nodes[@]}"; do rabbitmqctl -q -n "$node" stop >/dev/null 2>&1 || true; done
}
trap stop EXIT INT TERM
for port in "${ports[@]}"; do
  nodes+=("seckill-$port@localhost")
  node "$dir/$port" "${nodes[-1]}" "127.0.0.1:$port" $((port + 20000))
  # One after the other: three Erlang VMs booting at once starve a small machine. Booted
  # once its AMQP port answers.
  wait_port "${nodes[-1]} (log: $dir/$port/log)" "$port" 120
done
for node in "${nodes[@]:1}"; do
  join "$node" "${nodes[0]}"
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
