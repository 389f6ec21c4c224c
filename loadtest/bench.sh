#!/usr/bin/env bash
# One command, everything local: seckill against yardsticks on the same machine, in rounds.
#
#   ./loadtest/bench.sh        (DURATION=10s CONNECTIONS=64 ROUNDS=3 by default)
#
# What is compared, each pair within a round in A B B A order (so a machine that speeds up
# or slows down during a round weighs on both sides alike), over ROUNDS rounds, each on
# items put on sale for it (seckill's and the bare server's alike: buyers who won in one
# round would only be duplicates in the next): the report gives every round's ratio, the
# median and the range.
#   - the purchase path (buyers at random out of 300,000 on an item in stock: wins, then
#     duplicates) against a bare axum server making the same grab.lua call (loadtest/bare.rs
#     `/grab`: the server's own overhead) and the least a sale can do in Redis
#     (`/minimal`, loadtest/lua/minimal.lua), both sent the same requests;
#   - the sold-out path against a bare hello handler sent the same requests;
#   - a crowd (the same 300,000 buyers at random on another item in stock) against what a
#     crowd of new buyers costs at the least (`/minimal/fresh`: every request a new buyer)
#     and a plain `GET` hello: the user's view, how much of a bare server's rate seckill keeps;
#   - the purchase path of a server without a broker (its orders wait in its outbox: the
#     handler's own share) against `/grab` again.
# Once, before the rounds: the consumer draining 100,000 queued orders into MySQL. The
# server runs every role (API, consumer, scheduler) at the default settings.
#
# Writes loadtest/out/bench/bench.json (loadtest/report.py: the commit, the machine and its steal
# time, every run) and prints its summary; the reports the docs cite are copied to
# loadtest/results/. Uses a private Redis on port 16600 with the deployment's settings
# (REDIS_SALE_SETTINGS in dev/lib.sh), and the machine's MariaDB and RabbitMQ under the
# namespace and database `seckill_bench`, emptied before and after. Logs and wrk outputs
# stay in loadtest/out/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

duration=${DURATION:-10s}
connections=${CONNECTIONS:-64}
rounds=${ROUNDS:-3}
threads=2
fill_units=100000
users=300000
stock=400000
[[ $duration =~ ^[0-9]+s$ ]] || die "DURATION is in seconds (10s), not '$duration'"
# One unit a request of `/minimal/fresh`: room for 100,000 a second in a round's two runs.
fresh_units=$((2 * 100000 * ${duration%s}))

./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill --example bare 2>&1 | tail -1

out=loadtest/out/bench
rm -rf "$out" && mkdir -p "$out"
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
  forget "${ns}_alone"
}
cleanup
trap cleanup EXIT
private_redis "$redis_port" "$out"

stat() { admin GET "/admin/items/$1/stats" | sed -E "s/.*\"$2\":([0-9]+).*/\1/"; }
rows() { mariadb -h 127.0.0.1 -u root -N -e "SELECT COUNT(*) FROM \`$ns\`.orders WHERE item_id = $1"; }
report_begin "DURATION=$duration CONNECTIONS=$connections ROUNDS=$rounds"
tokens_and_api
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
drain_rate=$(echo "($fill_units - $first_count) / ($t1 - $t0)" | bc)
# From here one server runs every role, as a deployment's would.
kill "$consumer_pid" "$api_pid"
wait "$consumer_pid" "$api_pid" 2>/dev/null || true
"$bin" serve >"$out/server.log" 2>&1 &
api_pid=$!
pids+=("$api_pid")
wait_http "$api/healthz"

bare=http://127.0.0.1:18081
bare_pid=
# fresh_bare NAMESPACE: the bare server started anew with items of its own, untouched: each
# round's yardsticks meet a stock as full as seckill's fresh items do.
fresh_bare() {
  [ -n "$bare_pid" ] && { kill "$bare_pid"; wait "$bare_pid" 2>/dev/null || true; }
  target/release/examples/bare --addr 127.0.0.1:18081 --redis "$SECKILL_REDIS_URL" \
    --namespace "$1" --units "$stock" --fresh-units "$fresh_units" >"$out/bare-$1.log" 2>&1 &
  bare_pid=$!
  pids+=("$bare_pid")
  wait_http "$bare/hello" 60 "$bare_pid"
  bare_ns=$1
}
# What the round's /minimal/fresh runs left: none left would have made them sold-out answers.
fresh_held() {
  local left
  left=$(r llen "$bare_ns:{item:3}:v1:tokens")
  [ "$left" -gt 0 ] || die "/minimal/fresh ran out of units in $bare_ns: its runs answered sold out"
}

# Between runs: the last run's orders out of the outbox and into MySQL, then two quiet
# seconds, so that each run finds the machine alike.
drained() {
  local item
  for item in "$@"; do
    [ "$(r zcard "$ns:{item:$item}:v1:outbox")" = 0 ] && [ "$(r hlen "$ns:{item:$item}:v1:pending")" = 0 ] || return 1
  done
}
settle() {
  wait_until 60 drained "$purchase_item" "$crowd_item" || true
  sleep 2
}
post() { # file url [env...]: wrk POSTs of loadtest/wrk/flashbuy.lua
  local file=$1 url=$2
  shift 2
  env TOKENS="$out/tokens.txt" MODE=random "$@" THREADS=$threads \
    wrk -t$threads -c"$connections" -d"$duration" --latency -s loadtest/wrk/flashbuy.lua "$url" >"$file"
}
# run ROUND NAME: one timed run, its figures appended to $out/runs.tsv.
run_count=0
run() {
  # Numbered: a name runs twice a round, and each run's wrk output is kept.
  run_count=$((run_count + 1))
  local file
  file=$(printf '%s/%03d-%s-%s.txt' "$out" "$run_count" "$2" "$1")
  settle
  case $2 in
    purchase) post "$file" "$api/api/flashbuy" ITEM="$purchase_item" ;;
    bare_grab | bare_grab_alone) post "$file" "$bare/grab" BARE_USERS=$users ITEM=1 ;;
    bare_minimal) post "$file" "$bare/minimal" BARE_USERS=$users ITEM=1 ;;
    sold_out) post "$file" "$api/api/flashbuy" ITEM=3 ;;
    bare_hello) post "$file" "$bare/hello" ITEM=3 ;;
    crowd) post "$file" "$api/api/flashbuy" ITEM="$crowd_item" ;;
    bare_fresh) post "$file" "$bare/minimal/fresh" ITEM="$crowd_item" ;;
    hello_get) wrk -t$threads -c"$connections" -d"$duration" --latency "$bare/hello" >"$file" ;;
    alone) post "$file" "$alone/api/flashbuy" ITEM="$purchase_item" ;;
    *) die "no run named $2" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" $(wrk_rps_p99 "$file") >>"$out/runs.tsv"
  echo "round $1: $2 $(wrk_rps_p99 "$file")" >&2
}
# palindrome ROUND NAME...: the runs in order, then back (A B C C B A).
palindrome() {
  local round=$1 i
  shift
  for ((i = 1; i <= $#; i++)); do run "$round" "${!i}"; done
  for ((i = $#; i >= 1; i--)); do run "$round" "${!i}"; done
}

# Every round on fresh items, seckill's and the yardsticks' alike: the same buyers pressing
# again would turn a round's wins into the next one's duplicates.
: >"$out/runs.tsv"
for round in $(seq "$rounds"); do
  purchase_item=$((10 + round)) crowd_item=$((20 + round))
  on_sale "$purchase_item" "$stock"
  on_sale "$crowd_item" "$stock"
  fresh_bare "bench_bare_$round"
  palindrome "$round" purchase bare_grab bare_minimal
  palindrome "$round" sold_out bare_hello
  palindrome "$round" crowd bare_fresh hello_get
  fresh_held
done
peak_kb=$(awk '/VmHWM/ {print $2}' "/proc/$api_pid/status")

# The handler's own share: a server whose broker is unreachable (orders wait in its
# outbox), so no publishing, RabbitMQ or relay work shares the cores. Its own namespace.
kill "$api_pid"
alone=http://127.0.0.1:18083
SECKILL_NAMESPACE=${ns}_alone SECKILL_HTTP_ADDR=127.0.0.1:18083 \
  SECKILL_AMQP_URL=amqp://guest:guest@127.0.0.1:1/%2f "$bin" serve --roles api >"$out/alone.log" 2>&1 &
pids+=("$!")
wait_http "$alone/healthz"
for round in $(seq "$rounds"); do
  purchase_item=$((30 + round)) crowd_item=$((30 + round))
  at=$alone on_sale "$purchase_item" "$stock"
  fresh_bare "bench_bare_alone_$round"
  palindrome "$round" alone bare_grab_alone
done

cat >"$out/figures.json" <<JSON
{"wrk": "-t$threads -c$connections -d$duration", "rounds": $rounds, "buyers": $users,
 "consumer_orders_per_s": $drain_rate, "consumer_orders": $fill_units,
 "server_peak_mb": $((peak_kb / 1024))}
JSON
report=$(write_report bench "$out/figures.json" "$out/runs.tsv" \
  "purchase / bare grab.lua server=purchase/bare_grab" \
  "purchase / bare minimal-script server=purchase/bare_minimal" \
  "sold out / bare hello, same requests=sold_out/bare_hello" \
  "crowd / minimal script, every request a new buyer=crowd/bare_fresh" \
  "crowd / plain GET hello=crowd/hello_get" \
  "purchase, no broker / bare grab.lua server=alone/bare_grab_alone")
python3 loadtest/report.py --summary "$report"
echo "written: $report" >&2
