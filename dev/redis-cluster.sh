#!/usr/bin/env bash
# A local Redis Cluster, and the one definition of a cluster node that the tests use too.
#
#   dev/redis-cluster.sh
#       3 masters and 3 replicas on 127.0.0.1:7000-7005 (cluster bus on 17000-17005), data
#       in target/redis-cluster, in the foreground (Ctrl-C stops it). Then, in another
#       terminal:
#         SECKILL_REDIS_URL=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 \
#           target/release/seckill serve
#   dev/redis-cluster.sh node DIR PORT [IP]
#       one node listening on IP:PORT (127.0.0.1 by default), its data and log
#       (DIR/redis.log) in DIR; the script becomes the node (exec), so its pid is the node's
#   dev/redis-cluster.sh create HOST:PORT...
#       makes those nodes one cluster with a replica per master (the first half masters)
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh
command -v redis-server >/dev/null || die "redis-server is missing: sudo apt-get install redis-server"

# A node: its append-only file on (one that rejoins after a kill must not come back empty
# as a master); a replica may always take over however long it was cut off (`WAIT` says
# what a replica holds, and the tests kill masters on purpose); failures noticed in 2 s;
# small hashes and sorted sets kept as a sale's Redis keeps them (REDIS_SALE_SETTINGS).
node() { # DIR PORT [IP]
  local dir=$1 port=$2 ip=${3:-127.0.0.1}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  exec redis-server --port "$port" --bind "$ip" --protected-mode no \
    --cluster-enabled yes --cluster-node-timeout 2000 --cluster-config-file nodes.conf \
    --cluster-replica-validity-factor 0 --save "" --appendonly yes \
    --dir "$dir" --logfile "$dir/redis.log" "${REDIS_SALE_SETTINGS[@]}"
}

create() { # HOST:PORT...
  redis-cli --cluster create "$@" --cluster-replicas 1 --cluster-yes >/dev/null ||
    die "redis-cli --cluster create $* failed"
}

case "${1:-}" in
  node) shift && node "$@" ;; # (exec: never returns)
  create) shift && create "$@" && exit ;;
  "") ;;
  *) die "usage: $0 [node DIR PORT [IP] | create HOST:PORT...]" ;;
esac

dir=target/redis-cluster
ports=(7000 7001 7002 7003 7004 7005)
rm -rf "$dir"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT INT TERM
for port in "${ports[@]}"; do
  (node "$dir/$port" "$port") &
  pids+=($!)
done
for port in "${ports[@]}"; do
  wait_port "Redis (log: $dir/$port/redis.log)" "$port" 10
done
create "${ports[@]/#/127.0.0.1:}"
cluster_ok() { redis-cli -p 7000 cluster info | grep -q cluster_state:ok; }
wait_until 30 cluster_ok || die "the cluster did not come up within 30 s (logs: $dir/*/redis.log)"
cat >&2 <<MSG
Redis Cluster up: 3 masters, 3 replicas on 127.0.0.1:7000-7005 (data in $dir).

  SECKILL_REDIS_URL=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 \\
    target/release/seckill serve

Ctrl-C stops it.
MSG
wait
