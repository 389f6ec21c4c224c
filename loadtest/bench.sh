#!/usr/bin/env bash
# One command, one run, everything local: seckill's purchase path against two yardsticks —
# a bare axum server doing only the same call of grab.lua (as a Redis Function), and one
# running the least a sale can do in Redis (loadtest/lua/minimal.lua), so the price of the
# outbox and the checks shows; both are sent the same requests as seckill — (also with the
# pipeline off: the handler's own share), its sold-out path against
# a bare hello handler given the same requests, the consumer draining 100,000 queued
# orders into MySQL, and the server's peak memory.
#
#   ./loadtest/bench.sh            (DURATION=10s CONNECTIONS=64 by default)
#
# Uses a private Redis on port 16600 with the deployment's settings (REDIS_SALE_SETTINGS in
# dev/lib.sh: how the machine's own Redis was started is not the benchmark's business), and
# the machine's MariaDB and RabbitMQ under the namespace and database `seckill_bench`,
# emptied before and after. Logs and wrk outputs stay in loadtest/out/.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

duration=${DURATION:-10s}
connections=${CONNECTIONS:-64}
threads=2
fill_units=100000
users=200000

./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill --example bare 2>&1 | tail -1

out=loadtest/out
mkdir -p "$out"
# One fixed namespace and database, emptied before and after: RabbitMQ's command line
# cannot delete exchanges, so a new name per run would leave a pair behind each time.
ns=seckill_bench
bench_env "$ns" 127.0.0.1:18080
redis_port=16600
export SECKILL_REDIS_URL=redis://127.0.0.1:$redis_port
bin=target/release/seckill
pids=()

r() { redis-cli -p "$redis_port" "$@"; }
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  r shutdown nosave >/dev/null 2>&1 || true
  forget "$ns"
}
cleanup
trap cleanup EXIT
private_redis "$redis_port" "$out"

stat() { admin GET "/admin/items/$1/stats" | sed -E "s/.*\"$2\":([0-9]+).*/\1/"; }
rows() { mariadb -h 127.0.0.1 -u root -N -e "SELECT COUNT(*) FROM \`$ns\`.orders WHERE item_id = $1"; }
# wrk: prints "requests_per_second p99" from its report.
run_wrk() { # name url [env...]
  local name=$1 url=$2; shift 2
  env "$@" THREADS=$threads wrk -t$threads -c"$connections" -d"$duration" --latency \
    -s loadtest/wrk/flashbuy.lua "$url" >"$out/$name.txt"
  awk '/Requests\/sec/ {rps=$2} /^ +99%/ {p99=$2} END {print rps, p99}' "$out/$name.txt"
}
run_wrk_get() { # name url
  wrk -t$threads -c"$connections" -d"$duration" --latency "$2" >"$out/$1.txt"
  awk '/Requests\/sec/ {rps=$2} /^ +99%/ {p99=$2} END {print rps, p99}' "$out/$1.txt"
}

tokens_and_api
on_sale 1 400000
on_sale 3 "$fill_units"

echo "filling the queue: selling $fill_units units of item 3 with no consumer running" >&2
for _ in $(seq 20); do
  sold=$(stat 3 sold)
  [ "$sold" -ge "$fill_units" ] && break
  # Each round starts after the users already served, so every request is a new buyer.
  THREADS=$threads TOKENS="$out/tokens.txt" ITEM=3 MODE=sequential FIRST_USER=$sold \
    wrk -t$threads -c"$connections" -d5s -s loadtest/wrk/flashbuy.lua "$api/api/flashbuy" >"$out/fill.txt"
done
all_pending() { [ "$(stat 3 pending)" = "$fill_units" ]; }
wait_until 20 all_pending || die "item 3 did not sell out: $(admin GET /admin/items/3/stats)"
# Every order confirmed by the broker: each pending one noted `confirmed`, none left in the
# outbox for the relay (no consumer runs here, so nothing leaves `pending`).
all_confirmed() {
  local key="$ns:{item:$1}:v1"
  [ "$(r hlen "$key:pending")" = "$(r scard "$key:confirmed")" ] &&
    [ "$(r zcard "$key:outbox")" = 0 ]
}
wait_until 20 all_confirmed 3 || true

echo "draining $fill_units queued orders with a consumer" >&2
SECKILL_HTTP_ADDR=127.0.0.1:18082 "$bin" serve --roles consumer >"$out/consumer.log" 2>&1 &
consumer_pid=$!
pids+=("$consumer_pid")
give_up=$((SECONDS + 120))
until [ "$(rows 3)" -gt 0 ]; do
  [ $SECONDS -lt $give_up ] || { echo "the consumer wrote nothing; see $out/consumer.log" >&2; exit 1; }
  sleep 0.02
done
first_count=$(rows 3)
t0=$(date +%s.%N)
until [ "$(rows 3)" -ge "$fill_units" ]; do
  [ $SECONDS -lt $give_up ] || { echo "the consumer stalled at $(rows 3) orders; see $out/consumer.log" >&2; exit 1; }
  sleep 0.05
done
t1=$(date +%s.%N)
kill "$consumer_pid"
drain_rate=$(echo "($fill_units - $first_count) / ($t1 - $t0)" | bc)

target/release/examples/bare --addr 127.0.0.1:18081 --redis "$SECKILL_REDIS_URL" \
  --namespace bench_bare --units 400000 >"$out/bare.log" 2>&1 &
pids+=("$!")
wait_http "http://127.0.0.1:18081/hello"

# Each seckill path runs right next to its yardstick, after the broker has settled, so
# that both see the machine in the same state.
settle() {
  wait_until 20 all_confirmed 1 || true
  sleep 2
}
settle
echo "the sold-out path, then the bare hello handler (the same requests, then plain GETs)" >&2
read -r soldout_rps soldout_p99 < <(run_wrk sold_out "$api/api/flashbuy" TOKENS="$out/tokens.txt" ITEM=3 MODE=random)
read -r hello_rps hello_p99 < <(run_wrk bare_hello http://127.0.0.1:18081/hello TOKENS="$out/tokens.txt" ITEM=3 MODE=random)
read -r get_rps get_p99 < <(run_wrk_get bare_hello_get http://127.0.0.1:18081/hello)
settle
echo "the purchase path (wins and duplicates: every request reaches Redis), then the bare grab.lua server" >&2
read -r redis_rps redis_p99 < <(run_wrk redis_path "$api/api/flashbuy" TOKENS="$out/tokens.txt" ITEM=1 MODE=random)
peak_kb=$(awk '/VmHWM/ {print $2}' "/proc/$api_pid/status")
settle
read -r bare_rps bare_p99 < <(run_wrk bare_grab http://127.0.0.1:18081/grab TOKENS="$out/tokens.txt" BARE_USERS=$users ITEM=1 MODE=random)
settle
read -r minimal_rps minimal_p99 < <(run_wrk bare_minimal http://127.0.0.1:18081/minimal TOKENS="$out/tokens.txt" BARE_USERS=$users ITEM=1 MODE=random)

# The handler's own share: an API server whose broker is unreachable (orders wait in its
# outbox), so no publishing, RabbitMQ or relay work shares the cores. Its own namespace.
echo "the purchase path with the pipeline off (no broker)" >&2
kill "$api_pid"
alone=http://127.0.0.1:18083
SECKILL_NAMESPACE=${ns}_alone SECKILL_HTTP_ADDR=127.0.0.1:18083 \
  SECKILL_AMQP_URL=amqp://guest:guest@127.0.0.1:1/%2f "$bin" serve --roles api >"$out/alone.log" 2>&1 &
pids+=("$!")
wait_http "$alone/healthz"
at=$alone on_sale 2 400000
sleep 2
read -r alone_rps alone_p99 < <(run_wrk redis_alone "$alone/api/flashbuy" TOKENS="$out/tokens.txt" ITEM=2 MODE=random)

ratio() { echo "scale=2; $1 / $2" | bc; }
cat <<REPORT

seckill benchmark — $(nproc) cores, $(date -u +%Y-%m-%d), wrk -t$threads -c$connections -d$duration, all on this machine

| path                                   | req/s      | p99      | yardstick            | req/s      | p99      | ratio |
|----------------------------------------|------------|----------|----------------------|------------|----------|-------|
| purchase, Redis path (wins+duplicates) | $redis_rps | $redis_p99 | bare grab.lua server | $bare_rps | $bare_p99 | $(ratio "$redis_rps" "$bare_rps") |
| purchase, Redis path (wins+duplicates) | $redis_rps | $redis_p99 | bare minimal-script server | $minimal_rps | $minimal_p99 | $(ratio "$redis_rps" "$minimal_rps") |
| the same, pipeline off (no broker)     | $alone_rps | $alone_p99 | bare grab.lua server | $bare_rps | $bare_p99 | $(ratio "$alone_rps" "$bare_rps") |
| purchase, sold out (from memory)       | $soldout_rps | $soldout_p99 | bare hello handler, same requests | $hello_rps | $hello_p99 | $(ratio "$soldout_rps" "$hello_rps") |

bare hello handler, plain GETs (no token, no body): $get_rps req/s, p99 $get_p99 (sold-out path against it: $(ratio "$soldout_rps" "$get_rps"))
consumer: $fill_units queued orders drained into MySQL at $drain_rate orders/s
server peak memory (VmHWM, API process): $((peak_kb / 1024)) MB
REPORT
