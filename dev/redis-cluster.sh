#!/usr/bin/env bash
# A local Redis Cluster for trying the server on one: 3 masters and 3 replicas on
# 127.0.0.1:7000-7005 (cluster bus on 17000-17005), data in target/redis-cluster, in the
# foreground (Ctrl-C stops it). Then, in another terminal:
#   SECKILL_REDIS_URL=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 \
#     target/release/seckill serve
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh
command -v redis-server >/dev/null || die "redis-server is missing: sudo apt-get install redis-server"
dir=target/redis-cluster
rm -rf "$dir"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT INT TERM
for port in 7000 7001 7002 7003 7004 7005; do
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-node-timeout 2000 \
    --cluster-config-file nodes.conf --cluster-replica-validity-factor 0 --appendonly yes --dir "$dir/$port" \
    --logfile "$(pwd)/$dir/$port/redis.log" &
  pids+=($!)
done
for port in 7000 7001 7002 7003 7004 7005; do
  wait_port "Redis (log: $dir/$port/redis.log)" "$port" 10
done
redis-cli --cluster create 127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002 \
  127.0.0.1:7003 127.0.0.1:7004 127.0.0.1:7005 --cluster-replicas 1 --cluster-yes >/dev/null
cluster_ok() { redis-cli -p 7000 cluster info | grep -q cluster_state:ok; }
wait_until 30 cluster_ok || die "the cluster did not come up within 30 s (logs: $dir/*/redis.log)"
cat >&2 <<MSG
Redis Cluster up: 3 masters, 3 replicas on 127.0.0.1:7000-7005 (data in $dir).

  SECKILL_REDIS_URL=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 \\
    target/release/seckill serve

Ctrl-C stops it.
MSG
wait
