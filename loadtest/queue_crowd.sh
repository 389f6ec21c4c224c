#!/usr/bin/env bash
# What a waiting room costs the server (loadtest/queue.sh measures what it costs Redis):
#
# 1. Refusals stay cheap: `wrk -t2 -c64` presses for 10 s over 200,000 tokens at random,
#    in turns A B B A, (A) an item sold out — today's cheapest path, `410` from memory —
#    and (B) a queued item without a pass — `403 queue_required`, from memory too: each
#    round's requests a second and the server's µs of CPU an answer.
# 2. 10,000 buyers waiting on one instance's event streams, held for 30 s while the line
#    moves (a buyer let in every second, so every stream's place changes): the server's
#    memory per open stream and its CPU while they are held (loadtest/streams.rs).
#
# Writes loadtest/out/queue_crowd/queue_crowd.json (loadtest/report.py: the commit, the
# machine and its steal time, the settings off their defaults, every round).
#
#   ./loadtest/queue_crowd.sh                    (STREAMS=10000 HOLD_S=30)
#
# Uses a private Redis on port 16606 and the machine's MariaDB and RabbitMQ under the
# namespace and database `seckill_queue_crowd`.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

users=200000
streams=${STREAMS:-10000}
hold=${HOLD_S:-30}
./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill --example streams 2>&1 | tail -1
bin=target/release/seckill
# A socket a stream in the server, and one in the client: each process's own limit.
ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -gt $((streams + 1000)) ] ||
  die "$streams streams need more open files than this shell may have ($(ulimit -n))"

out=loadtest/out/queue_crowd
rm -rf "$out" && mkdir -p "$out"
# A: item 3, one unit, sold to the first press.
sold_out_server seckill_queue_crowd 127.0.0.1:18094 16606 warn
# B: item 5, queued, a buyer let in a second; 1,000 units, so the line moves all along.
start=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
admin PUT /admin/items/5 "{\"name\":\"queued load test\",\"shop_id\":1,\"total\":1000,\"start_at\":\"$start\",\"end_at\":\"$end\",\"price_cents\":1,\"queue\":{\"admit_per_s\":1,\"pass_ttl_s\":30}}" >/dev/null
admin POST /admin/items/5/warmup >/dev/null

report_begin "${STREAMS:+STREAMS=$STREAMS }${HOLD_S:+HOLD_S=$HOLD_S}"
rounds=()
for item in 3 5 5 3; do
  t0=$(ticks /proc/"$api_pid"/stat)
  THREADS=2 TOKENS="$out/tokens.txt" ITEM=$item MODE=random \
    wrk -t2 -c64 -d10s --latency -s loadtest/wrk/flashbuy.lua "$api/api/flashbuy" >"$out/wrk-$item-${#rounds[@]}.txt"
  t1=$(ticks /proc/"$api_pid"/stat)
  requests=$(awk '/requests in/ {print $1}' "$out/wrk-$item-${#rounds[@]}.txt")
  rps=$(awk '/Requests\/sec/ {print $2}' "$out/wrk-$item-${#rounds[@]}.txt")
  p99=$(awk '$1 == "99%" {print $2}' "$out/wrk-$item-${#rounds[@]}.txt")
  us=$(cpu_us_per_request $((t1 - t0)) "$requests")
  path=$([ "$item" = 3 ] && echo sold_out || echo no_pass)
  printf '%-9s %10s req/s  %6s µs of CPU an answer  p99 %s\n' "$path" "$rps" "$us" "$p99" >&2
  rounds+=("{\"path\":\"$path\",\"requests_per_s\":$rps,\"server_cpu_us_per_answer\":$us,\"p99\":\"$p99\"}")
done
# What the no-pass refusals answered (one press shows it).
refusal=$(curl -s -X POST "$api/api/flashbuy" -H "Authorization: Bearer $(sed -n 7p "$out/tokens.txt")" \
  -H 'Content-Type: application/json' -H "X-Client-Time: $(date +%s%3N)" -d '{"item_id":5}')
echo "a press without a pass: $refusal" >&2

echo "$streams buyers joining and waiting on their event streams for $hold s" >&2
target/release/examples/streams --api "$api" --tokens "$out/tokens.txt" --item 5 \
  --streams "$streams" --hold-s "$hold" --pid "$api_pid" >"$out/streams.json"

IFS=,
cat >"$out/figures.json" <<JSON
{
  "rust_log": "$RUST_LOG",
  "refusal_without_a_pass": $(printf '%s' "$refusal"),
  "refusal_rounds": [${rounds[*]}],
  "streams": $(cat "$out/streams.json")
}
JSON
unset IFS
report=$(write_report queue_crowd "$out/figures.json")
cat "$report"
