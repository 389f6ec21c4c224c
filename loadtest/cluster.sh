#!/usr/bin/env bash
# The purchase path on a local Redis Cluster (3 masters, 3 replicas on 127.0.0.1:7000-7005,
# started here and stopped at the end): one hot item split into K = 1, 2, 4, 8 buckets,
# and K = 1 with SECKILL_REDIS_WAIT_REPLICAS=1 — and what WAIT costs on one bucket, as
# ratios of the K = 1 runs with and without it, run in the order A B B A (without, with,
# with, without) so that a machine drifting during the run weighs on both alike; with the
# WAITs the server sent and how long they took (its /metrics). For each: grabs/s and p99 through one API
# instance (wrk, wins and duplicates: every request reaches Redis), and what Redis spent
# per grab — the script time (EVALSHA and FCALL, INFO commandstats) and the whole server's CPU (INFO cpu),
# summed over the masters, and the busiest master's share — so the capacity
# model can say how many shards a sale of N presses/s needs.
#
#   ./loadtest/cluster.sh          (DURATION=10s CONNECTIONS=64 ROUNDS=3 by default)
#   MODE=sequential USERS=500000 ./loadtest/cluster.sh
#                                  every request a buyer's first press (a win each), so every
#                                  WAIT run's request waits for its replicas
#
# A second table splits each run's CPU a request between the API server, the masters, the
# replicas and the whole machine (wrk and the kernel's share included), from /proc.
#
# Everything shares this machine's cores: the absolute rates are this VM's; the Redis
# cost per grab and its spread over the masters are what carry over. Writes
# loadtest/out/cluster/cluster.json (loadtest/report.py: the commit, the machine and its
# steal time, every run, the WAIT ratio) beside the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

duration=${DURATION:-10s}
connections=${CONNECTIONS:-64}
rounds=${ROUNDS:-3}
users=${USERS:-200000}
# Random buyers (wins, then more and more duplicates) or each buyer once (wins only).
mode=${MODE:-random}
units=$((users > 400000 ? users : 400000))
ports=(7000 7001 7002 7003 7004 7005)

./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill 2>&1 | tail -1

out=loadtest/out/cluster
rm -rf "$out" && mkdir -p "$out"
ns=seckill_cluster_bench
bench_env "$ns" 127.0.0.1:18090 warn
export SECKILL_REDIS_URL="redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002"
bin=target/release/seckill
pids=()
server_pid=

cleanup() {
  for pid in "${pids[@]}" $server_pid; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  forget "$ns"
}
trap cleanup EXIT

./dev/redis-cluster.sh 2>"$out/cluster.log" &
pids+=("$!")
whole() {
  [ "$(redis-cli -p 7000 cluster info 2>/dev/null | grep -c 'cluster_state:ok')" = 1 ] &&
    [ "$(redis-cli -p 7000 cluster nodes 2>/dev/null | grep -c connected)" = 6 ]
}
wait_until 60 whole || die "the local Redis Cluster is not whole after 60 s; see $out/cluster.log"
masters() { for p in "${ports[@]}"; do redis-cli -p "$p" role | head -1 | grep -q master && echo "$p"; done; }
# Every write still goes to the append-only file, but no node forks in the middle of a
# run: six nodes snapshotting and rewriting their files at once on two cores made each
# run slower than the one before (14k req/s down to 5k in one sitting).
for p in "${ports[@]}"; do
  redis-cli -p "$p" config set save "" >/dev/null
  redis-cli -p "$p" config set auto-aof-rewrite-percentage 0 >/dev/null
done

serve() { # wait replicas
  [ -n "$server_pid" ] && { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; }
  SECKILL_REDIS_WAIT_REPLICAS=$1 "$bin" serve --roles api,scheduler >"$out/cluster-api.log" 2>&1 &
  server_pid=$!
  wait_http "$api/healthz"
}
# Busy clock ticks: of the whole machine (user, nice, system, irq, softirq), and of every
# process a run's CPU is split between: "api", "master" or "replica" and its ticks, a line
# each.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
process_ticks() {
  echo "api $(ticks "/proc/$server_pid/stat")"
  for p in "${ports[@]}"; do
    local role pid
    role=$(redis-cli -p "$p" role | head -1)
    pid=$(redis-cli -p "$p" info server | tr -d '\r' | awk -F: '/^process_id:/ {print $2}')
    echo "${role/slave/replica} $(ticks "/proc/$pid/stat")"
  done
}
# Sums over the masters: script calls (EVALSHA and FCALL), their µs, and the servers' CPU
# seconds; and the busiest master's share of the script time.
redis_cost() {
  local calls=0 usec=0 cpu=0 top=0
  for p in $(masters); do
    local c u s
    read -r c u < <(redis-cli -p "$p" info commandstats | tr -d '\r' |
      awk -F'[:,=]' '/^cmdstat_(evalsha|fcall):/ {c += $3; u += $5} END {print c + 0, u + 0}')
    s=$(redis-cli -p "$p" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {t += $2} END {print t}')
    calls=$((calls + c)); usec=$((usec + u)); cpu=$(echo "$cpu + $s" | bc)
    [ "$u" -gt "$top" ] && top=$u
  done
  echo "$calls $usec $cpu $top"
}

echo "minting $users user tokens" >&2
"$bin" token --user 1 --count "$users" --ttl-s 7200 >"$out/tokens.txt"
serve 0
start=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)

rows=()
cpu_rows=()
declare -A rps_sum p99_sum
run() { # item buckets wait
  local item=$1 buckets=$2
  admin PUT "/admin/items/$item" "{\"name\":\"hot $item\",\"shop_id\":1,\"total\":$units,\"start_at\":\"$start\",\"end_at\":\"$end\",\"price_cents\":1,\"buckets\":$buckets}" >/dev/null
  admin POST "/admin/items/$item/warmup" >/dev/null
  sleep 1
  read -r c0 u0 cpu0 _ < <(redis_cost)
  for p in $(masters); do redis-cli -p "$p" config resetstat >/dev/null; done
  process_ticks >"$out/cluster-ticks-before.txt"
  local machine0
  machine0=$(machine_ticks)
  THREADS=2 TOKENS="$out/tokens.txt" ITEM=$item MODE=$mode wrk -t2 -c"$connections" -d"$duration" --latency \
    -s loadtest/wrk/flashbuy.lua "$api/api/flashbuy" >"$out/cluster-k$buckets-w$3.txt"
  local machine1
  machine1=$(machine_ticks)
  process_ticks >"$out/cluster-ticks-after.txt"
  read -r calls usec cpu1 top < <(redis_cost)
  local requests api_ticks master_ticks replica_ticks
  requests=$(awk '/requests in/ {print $1}' "$out/cluster-k$buckets-w$3.txt")
  # Ticks per role (processes of one role summed), then µs a request of each and the machine's.
  read -r api_ticks master_ticks replica_ticks < <(
    paste "$out/cluster-ticks-before.txt" "$out/cluster-ticks-after.txt" |
      awk '{t[$1] += $4 - $2} END {print t["api"] + 0, t["master"] + 0, t["replica"] + 0}')
  cpu_rows+=("| $buckets | $3 | $(cpu_us_per_request "$api_ticks" "$requests") | $(cpu_us_per_request "$master_ticks" "$requests") | $(cpu_us_per_request "$replica_ticks" "$requests") | $(cpu_us_per_request "$((machine1 - machine0))" "$requests") |")
  local rps p99
  rps=$(awk '/Requests\/sec/ {print $2}' "$out/cluster-k$buckets-w$3.txt")
  p99=$(awk '/^ +99%/ {print $2}' "$out/cluster-k$buckets-w$3.txt")
  # CPU counters survive RESETSTAT: the difference is this run's.
  local cpu_us_per_grab
  cpu_us_per_grab=$(echo "scale=1; ($cpu1 - $cpu0) * 1000000 / ($calls + 1)" | bc)
  rows+=("| $buckets | $3 | $rps | $p99 | $calls | $(echo "scale=1; $usec / ($calls + 1)" | bc) | $cpu_us_per_grab | $((100 * top / (usec + 1)))% |")
  printf '%s\tk%s_wait%s\t%s\t%s\n' "$current_round" "$buckets" "$3" "$rps" "$(wrk_ms "$p99")" >>"$out/runs.tsv"
  if [ "$buckets" = 1 ]; then
    rps_sum[$3]=$(echo "${rps_sum[$3]:-0} + $rps" | bc)
    p99_sum[$3]=$(echo "${p99_sum[$3]:-0} + $(wrk_ms "$p99")" | bc)
  fi
  : "$c0" "$u0"
}
# What the server's WAITs did, from its /metrics: how many, their mean time, wins each.
wait_stats() {
  curl -fs "$api/metrics" | awk '
    /^seckill_redis_waits_total/ { waits = $2 }
    /^seckill_stage_duration_seconds_sum.*redis_wait/ { secs = $2 }
    /^seckill_funnel_total.*stage="won"/ { won = $2 }
    END { if (waits > 0) printf "%d WAITs, %.2f ms each on average, %.1f wins per WAIT", waits, 1000 * secs / waits, won / waits }'
}
report_begin "DURATION=$duration CONNECTIONS=$connections ROUNDS=$rounds MODE=$mode USERS=$users"
: >"$out/runs.tsv"
# WAIT against none on one bucket, A B B A, in ROUNDS rounds (each run on an item of its
# own, as full as the others); then K = 2, 4, 8 once each (round 0 in the report).
waits=""
for round in $(seq "$rounds"); do
  current_round=$round base=$((100 * round))
  run $((base + 1)) 1 0
  serve 1
  run $((base + 2)) 1 1
  run $((base + 3)) 1 1
  waits="$waits${waits:+; }round $round: $(wait_stats)"
  serve 0
  run $((base + 4)) 1 0
done
current_round=0
run 2 2 0
run 4 4 0
run 8 8 0

{
  printf '{"wrk": "-t2 -c%s -d%s", "buyers": "%s out of %s", "waits": "%s",\n "table": [' "$connections" "$duration" "$mode" "$users" "$waits"
  printf '"%s",' "${rows[@]}" | sed 's/,$//'
  printf '],\n "cpu_us_a_request": ['
  printf '"%s",' "${cpu_rows[@]}" | sed 's/,$//'
  printf ']}\n'
} >"$out/figures.json"
report=$(write_report cluster "$out/figures.json" "$out/runs.tsv" "WAIT 1 / no WAIT, one bucket=k1_wait1/k1_wait0")
echo "written: $report" >&2
cat <<REPORT

seckill on a local Redis Cluster (3 masters + 3 replicas) — $(nproc) cores, $(date -u +%Y-%m-%d), wrk -t2 -c$connections -d$duration, buyers $mode out of $users, all on this machine

| buckets | WAIT | req/s | p99 | script calls | µs per call | Redis CPU µs per grab | busiest master |
|---------|------|-------|-----|---------------|----------------|-----------------------|----------------|
$(printf '%s\n' "${rows[@]}")

CPU µs a request (buyers: $mode), per role and for the whole machine (wrk and the kernel included):

| buckets | WAIT | API server | masters | replicas | machine |
|---------|------|------------|---------|----------|---------|
$(printf '%s\n' "${cpu_rows[@]}")

WAIT 1 on one bucket, against no WAIT (all rounds' runs): $(echo "scale=2; ${rps_sum[1]} / ${rps_sum[0]}" | bc) of the throughput, p99 $(echo "scale=2; ${p99_sum[1]} / ${p99_sum[0]}" | bc)×; $waits
REPORT
