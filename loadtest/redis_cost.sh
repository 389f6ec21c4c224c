#!/usr/bin/env bash
# What a purchase costs Redis, measured two ways on a private Redis (port 16400) that
# nothing else uses:
#   1. per script call, by outcome: `usec_per_call` of EVALSHA in INFO commandstats while
#      loadtest/redis_cost.rs runs only wins, only duplicates, only sold-out answers, then
#      the minimal pop-and-record script (loadtest/lua/minimal.lua);
#   2. per won order, everything included: Redis's CPU (INFO cpu, user + sys) before and
#      after `seckill rehearse` sells ORDERS units to as many distinct buyers, each pressing
#      once, with the whole server running (API, consumer, scheduler) until every order is
#      in MySQL and the outbox and pending orders are empty; net of Redis's use while the
#      same server idles for as long — then, counted alike, 200,000 wins of the minimal
#      script (redis-benchmark), so the won order is also a multiple of the least a sale
#      can cost Redis, the figure to carry to other hardware. On this VM it is no steadier
#      than the µs (1.76–2.37 in three runs a minute apart, the µs 17.2–22.9).
#
#   ./loadtest/redis_cost.sh          (CALLS=50000 ORDERS=20000 by default)
#   REDIS_CPU=1 ./loadtest/redis_cost.sh   Redis on core 1, everything this script starts
#                                      on the others (the machine's MariaDB and RabbitMQ
#                                      are not moved) (usec is wall time: sharing a core with the
#                                      server, Redis counts its waits for the core too)
#   COUNT=instructions ./loadtest/redis_cost.sh   Redis under valgrind's callgrind: the
#                                      second figure in instructions per won order (the
#                                      same on every run, where CPU time on this shared
#                                      VM moves 2× between days), beside what a win of
#                                      the minimal script costs; no per-call figures
#                                      (grab_anatomy.sh counts those). ORDERS=5000 and
#                                      16 buyers at once by default: Redis runs ~50×
#                                      slower and must still answer within the budget.
#   REDIS_DEFAULTS=1 COUNT=instructions ./loadtest/redis_cost.sh   the same at Redis's own
#                                      listpack defaults: what the deployment's settings
#                                      buy (docs/deployment.md)
#
# Writes loadtest/out/redis_cost/redis_cost.json (loadtest/report.py: the commit, the
# machine and its steal time beside the figures), the per won order figure also as a
# multiple of the minimal script's win in the same run — the figure to carry to another
# machine (docs/deployment.md's capacity model). Uses the machine's MariaDB and RabbitMQ
# under the namespace and database `seckill_cost`.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

count=${COUNT:-usec}
case $count in
  usec) orders=${ORDERS:-20000} concurrency=64 ;;
  instructions) orders=${ORDERS:-5000} concurrency=16 ;;
  *) die "COUNT is usec or instructions, not '$count'" ;;
esac
calls=${CALLS:-50000}
port=16400
./dev/services.sh
cargo build --release --locked --bin seckill --example redis_cost 2>&1 | tail -1

out=loadtest/out/redis_cost
rm -rf "$out" && mkdir -p "$out"
ns=seckill_cost
bench_env "$ns" 127.0.0.1:18087
export SECKILL_REDIS_URL=redis://127.0.0.1:$port
pids=()
private() { redis-cli -p "$port" "$@"; }

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  private shutdown nosave >/dev/null 2>&1 || true
  forget "$ns"
}
cleanup
trap cleanup EXIT

# Pinned when asked: Redis to REDIS_CPU, this script (and so everything it starts) off it.
pin=()
if [ -n "${REDIS_CPU:-}" ]; then
  pin=(taskset -c "$REDIS_CPU")
  others=$(seq 0 $(($(nproc) - 1)) | grep -vx "$REDIS_CPU" | paste -sd,)
  taskset -pc "$others" $$ >/dev/null
fi
# REDIS_DEFAULTS=1: the private Redis at Redis's own listpack defaults, not the deployment's.
redis_defaults=
if [ "${REDIS_DEFAULTS:-0}" = 1 ]; then REDIS_SALE_SETTINGS=() redis_defaults="REDIS_DEFAULTS=1 "; fi
report_begin "${REDIS_CPU:+REDIS_CPU=$REDIS_CPU }${COUNT:+COUNT=$COUNT }$redis_defaults""CALLS=$calls ORDERS=$orders"
redis_args=(--port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$PWD/$out"
  --logfile "$PWD/$out/redis.log" "${REDIS_SALE_SETTINGS[@]}")
if [ "$count" = instructions ]; then
  callgrind_redis "$PWD/$out" "${redis_args[@]}"
  pids+=("$callgrind_pid")
  wait_until 60 private ping || die "the private Redis did not start; see $out/valgrind.log"
else
  "${pin[@]}" redis-server "${redis_args[@]}" --daemonize yes >/dev/null
  wait_until 5 private ping || die "the private Redis did not start; see $out/redis.log"
  echo "per call: $calls wins, $calls duplicates, $calls sold-out answers, $calls minimal wins" >&2
  target/release/examples/redis_cost --redis "$SECKILL_REDIS_URL" --calls "$calls" |
    tee "$out/per_call.txt"
  private flushall >/dev/null
fi

# What Redis spent so far: µs of CPU (user + sys), or instructions (callgrind's count
# since the last dump, added up in $out/instructions).
echo 0 >"$out/instructions"
cpu_us() {
  if [ "$count" = instructions ]; then
    echo $(($(cat "$out/instructions") + $(callgrind_since))) >"$out/instructions"
    cat "$out/instructions"
  else
    private info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.0f", s * 1000000}'
  fi
}
# Orders still in an outbox (ZSET) or pending (HASH), over every bucket of the run.
drained() {
  [ "$(private eval "local n = 0
    for _, k in ipairs(redis.call('KEYS', ARGV[1] .. ':*:v1:outbox')) do n = n + redis.call('ZCARD', k) end
    for _, k in ipairs(redis.call('KEYS', ARGV[1] .. ':*:v1:pending')) do n = n + redis.call('HLEN', k) end
    return n" 0 "$ns")" = 0 ]
}

target/release/seckill serve >"$out/server.log" 2>&1 &
pids+=("$!")
wait_http "http://$SECKILL_HTTP_ADDR/healthz"
sleep 3
idle_s=10
echo "the server idling for ${idle_s}s" >&2
before=$(cpu_us)
sleep "$idle_s"
idle_rate=$(( ($(cpu_us) - before) / idle_s ))

echo "selling $orders units to $orders buyers, each pressing once" >&2
private config resetstat >/dev/null
before=$(cpu_us)
t0=$(date +%s.%N)
target/release/seckill rehearse --units "$orders" --users "$orders" --requests "$orders" \
  --concurrency "$concurrency" --out "$out/bench" >"$out/bench.log" 2>&1 ||
  { echo "seckill rehearse failed; see $out/bench.log" >&2; exit 1; }
wait_until 60 drained || die "orders still in the outbox or pending; see $out/server.log"
after=$(cpu_us)
t1=$(date +%s.%N)
won=$(grep -oE '"won": *[0-9]+' "$out/bench/report.json" | head -1 | grep -oE '[0-9]+$') ||
  { echo "no \"won\" in $out/bench/report.json" >&2; exit 1; }
elapsed_us=$(echo "($t1 - $t0) * 1000000" | bc | cut -d. -f1)
net=$(( after - before - idle_rate * elapsed_us / 1000000 ))

# What Redis's commands cost over the run, before the yardstick adds its own.
private info commandstats | tr -d '\r' >"$out/commandstats.txt"

# The yardstick in the same unit, counted alike while the server idles beside it: wins of
# loadtest/lua/minimal.lua from redis-benchmark (16 clients, 8 calls pipelined each), each
# a new buyer. Under callgrind 5,000 are enough (the count is exact); timed, 200,000 (a
# second or two of Redis's CPU, against the idle server's few ms a second).
yardstick_wins=$([ "$count" = instructions ] && echo 5000 || echo 200000)
minimal=$(private script load "$(cat loadtest/lua/minimal.lua)")
for first in $(seq 1 10000 "$yardstick_wins"); do
  last=$((first + 9999 < yardstick_wins ? first + 9999 : yardstick_wins))
  private rpush yardstick:tokens $(seq "$first" "$last") >/dev/null
done
m0=$(cpu_us)
s0=$(date +%s.%N)
redis-benchmark -p "$port" -c 16 -P 8 -n "$yardstick_wins" -r 1000000000 evalsha "$minimal" 3 \
  yardstick:meta yardstick:tokens yardstick:buyers __rand_int__ 1764000000000 >/dev/null
m1=$(cpu_us)
s_us=$(echo "($(date +%s.%N) - $s0) * 1000000" | bc | cut -d. -f1)
minimal_spent=$((m1 - m0 - idle_rate * s_us / 1000000))
[ "$(private llen yardstick:tokens)" -lt $((yardstick_wins / 100)) ] ||
  die "the yardstick's wins were not wins: $(private llen yardstick:tokens) units left of $yardstick_wins"
multiple=$(awk -v a="$net" -v w="$won" -v m="$minimal_spent" -v n="$yardstick_wins" 'BEGIN {printf "%.2f", (a / w) / (m / n)}')
commands() { # UNIT: Redis's commands over the run, per won order
  awk -F'[:,=]' -v won="$won" -v unit="$1" \
    '/^cmdstat_/ { printf "  %-22s %9.2f %s  %6.2f calls\n", substr($1, 9), $5 / won, unit, $3 / won }' \
    "$out/commandstats.txt" | sort -k2 -nr | head -20
}

if [ "$count" = instructions ]; then
  minimal_win=$((minimal_spent / yardstick_wins))
  cat >"$out/figures.json" <<JSON
{"count": "instructions", "buyers": $orders, "won": $won,
 "instructions_per_won_order": $(( net / won )), "minimal_win_instructions": $minimal_win,
 "multiple_of_minimal_win": $multiple}
JSON
  report=$(write_report redis_cost "$out/figures.json")
  echo "written: $report" >&2
  cat <<REPORT

Redis instructions per won order, everything included ($(date -u +%Y-%m-%d), under callgrind):
$orders buyers pressing once, $won won; Redis ran $(( (after - before) / 1000000 )) M instructions in $(echo "scale=1; $elapsed_us / 1000000" | bc) s,
$(( idle_rate * elapsed_us / 1000000000000 )) M of them what the idle server runs in that time:
**$(( net / won )) instructions of Redis per won order**, against $minimal_win for a win of the
minimal script: $multiple×

Commands per won order (INFO commandstats over the run; µs under callgrind, so only their
proportions mean anything):
REPORT
  commands µs
  exit 0
fi
per_won=$(awk -v a="$net" -v w="$won" 'BEGIN {printf "%.1f", a / w}')
minimal_win=$(awk -v m="$minimal_spent" -v n="$yardstick_wins" 'BEGIN {printf "%.2f", m / n}')
per_call=$(awk -F'|' '$3 ~ /[0-9]/ {gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); printf "%s\"%s\": %s", (n++ ? ", " : ""), $2, $3}' "$out/per_call.txt")
cat >"$out/figures.json" <<JSON
{"count": "usec", "calls": $calls, "buyers": $orders, "won": $won,
 "redis_version": "$(private info server | awk -F: '/^redis_version/ {print $2}' | tr -d '\r')",
 "redis_cpu_us_per_won_order": $per_won, "idle_cpu_us_per_s": $idle_rate,
 "minimal_win_redis_cpu_us": $minimal_win, "minimal_wins": $yardstick_wins,
 "multiple_of_minimal_win": $multiple,
 "per_call_us": {$per_call}}
JSON
report=$(write_report redis_cost "$out/figures.json")
echo "written: $report" >&2
cat <<REPORT

Redis CPU per won order, everything included ($(date -u +%Y-%m-%d), Redis $(private info server | awk -F: '/^redis_version/ {print $2}' | tr -d '\r')):
$orders buyers pressing once, $won won; Redis used $(( (after - before) / 1000 )) ms of CPU in $(echo "scale=1; $elapsed_us / 1000000" | bc) s,
$(( idle_rate * elapsed_us / 1000000000 )) ms of it what the idle server costs in that time:
**$per_won µs of Redis CPU per won order**, $multiple× the $minimal_win µs of Redis CPU a win of
the minimal script cost in the same run ($yardstick_wins of them, counted alike)

Where it went, per won order (INFO commandstats over the run, the idle server's share not
taken out; a command inside a script counts in the script's time and in its own line too):
REPORT
commands µs
