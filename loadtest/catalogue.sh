#!/usr/bin/env bash
# What a large catalogue costs when nothing happens: an API instance and a scheduler
# instance with 100, 10,000 and 100,000 items on sale and loaded (10 units each), idle for
# 30 s — the CPU of each and of Redis, as shares of one core — then operators' calls on a
# new item (PUT, warm-up, stats, pause, resume: median of 5 each), the bulk calls on 10,000
# new items (items per second), and the sold-out path; last, a sale day's set-up the bulk
# way: 100,000 new items (SETUP_ITEMS) written and loaded, 10,000 per call.
#
#   ./loadtest/catalogue.sh             (SIZES="100 10000 100000" by default)
#
# The items beyond the first are written straight into MySQL and Redis (as a warm-up
# leaves them) so that setting up 100,000 takes seconds. Uses the machine's services under
# the namespace and database `seckill_catalogue_bench`, emptied before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

sizes=${SIZES:-100 10000 100000}
./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill 2>&1 | tail -1

out=loadtest/out
mkdir -p "$out"
ns=seckill_catalogue_bench
bench_env "$ns" 127.0.0.1:18099 warn
scheduler_addr=127.0.0.1:18098
report_begin
bin=target/release/seckill
server_pid=
scheduler_pid=

cleanup() {
  for pid in $server_pid $scheduler_pid; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  server_pid= scheduler_pid=
  forget "$ns"
}
trap cleanup EXIT

# timed_admin METHOD PATH [JSON]: `admin` (loadtest/lib.sh), printing the seconds it took.
timed_admin() {
  local admin_curl=(-o /dev/null -w '%{time_total}\n')
  admin "$@"
}
median() { sort -n | awk '{a[NR] = $1} END {printf "%.1f", a[int((NR + 1) / 2)] * 1000}'; }
redis_cpu() { redis-cli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {t += $2} END {print t}'; }

"$bin" token --user 1 --count 20000 --ttl-s 7200 >"$out/catalogue-tokens.txt"
start=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
rows=()
for n in $sizes; do
  cleanup
  "$bin" serve --roles api >"$out/catalogue-$n.log" 2>&1 &
  server_pid=$!
  wait_http "$api/healthz"
  SECKILL_HTTP_ADDR=$scheduler_addr "$bin" serve --roles scheduler >"$out/catalogue-$n-scheduler.log" 2>&1 &
  scheduler_pid=$!
  wait_http "http://$scheduler_addr/healthz"
  # Item 1 the operators' way (it also creates shop 1), sold out below.
  admin PUT /admin/items/1 "{\"name\":\"one\",\"shop_id\":1,\"total\":10,\"start_at\":\"$start\",\"end_at\":\"$end\",\"price_cents\":1}" >/dev/null
  admin POST /admin/items/1/warmup >/dev/null
  if [ "$n" -gt 1 ]; then
    echo "writing $((n - 1)) more items into MySQL and Redis" >&2
    mariadb -h 127.0.0.1 -u root "$ns" -e "
      INSERT INTO items (id, shop_id, name, total, price_cents, start_at, end_at, loaded_at)
      SELECT seq, 1, CONCAT('item ', seq), 10, 100, UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE,
             UTC_TIMESTAMP(3) + INTERVAL 1 DAY, UTC_TIMESTAMP(3)
      FROM seq_2_to_$n"
    now_ms=$(date +%s%3N)
    seq 2 "$n" | awk -v ns="$ns" -v now="$now_ms" -v end="$((now_ms + 86400000))" '
      function cmd(n, args,   i, s) { s = "*" n "\r\n"; for (i = 1; i <= n; i++) s = s "$" length(args[i]) "\r\n" args[i] "\r\n"; printf "%s", s }
      {
        k = ns ":{item:" $1 "}:v1:"
        split("HSET|" k "meta|loaded|" now "|total|10|sold|0|paused|0|start_ms|0|end_ms|" end, a, "|"); cmd(14, a)
        split("RPUSH|" k "tokens|1|2|3|4|5|6|7|8|9|10", b, "|"); cmd(12, b)
        split("SADD|" ns ":items:v1|" $1, c, "|"); cmd(3, c)
      }' | redis-cli --pipe >/dev/null
  fi
  # Settle (a full read of the definitions included), then 30 s of nothing.
  sleep 35
  t0=$(ticks "/proc/$server_pid/stat"); q0=$(ticks "/proc/$scheduler_pid/stat"); r0=$(redis_cpu); s0=$(date +%s.%N)
  sleep 30
  t1=$(ticks "/proc/$server_pid/stat"); q1=$(ticks "/proc/$scheduler_pid/stat"); r1=$(redis_cpu); s1=$(date +%s.%N)
  hz=$(getconf CLK_TCK)
  server_cpu=$(echo "scale=1; 100 * ($t1 - $t0) / $hz / ($s1 - $s0)" | bc)
  scheduler_cpu=$(echo "scale=1; 100 * ($q1 - $q0) / $hz / ($s1 - $s0)" | bc)
  redis_share=$(echo "scale=1; 100 * ($r1 - $r0) / ($s1 - $s0)" | bc)
  # Operators' calls on new items, five of each.
  put=(); warm=(); stats=(); pause=(); resume=()
  for i in 1 2 3 4 5; do
    id=$((n + 1000 + i))
    put+=("$(timed_admin PUT "/admin/items/$id" "{\"name\":\"new $id\",\"shop_id\":1,\"total\":10,\"start_at\":\"$start\",\"end_at\":\"$end\",\"price_cents\":1}")")
    warm+=("$(timed_admin POST "/admin/items/$id/warmup")")
    stats+=("$(timed_admin GET "/admin/items/$id/stats")")
    pause+=("$(timed_admin POST "/admin/items/$id/pause")")
    resume+=("$(timed_admin POST "/admin/items/$id/resume")")
  done
  # The bulk calls: 10,000 new items written, then loaded.
  bulk=10000
  first=$((n + 2000))
  seq "$first" $((first + bulk - 1)) | awk -v start="$start" -v end="$end" '
    BEGIN { printf "{\"items\":[" }
    { printf "%s{\"id\":%d,\"name\":\"bulk %d\",\"shop_id\":2,\"total\":10,\"start_at\":\"%s\",\"end_at\":\"%s\",\"price_cents\":1}", (NR > 1 ? "," : ""), $1, $1, start, end }
    END { printf "]}" }' >"$out/catalogue-bulk.json"
  bulk_put=$(curl -fsS -o /dev/null -w '%{time_total}' -X PUT "$api/admin/items" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
    -H 'Content-Type: application/json' --data-binary @"$out/catalogue-bulk.json")
  ids=$(seq -s, "$first" $((first + bulk - 1)))
  bulk_warm=$(curl -fsS -o /dev/null -w '%{time_total}' -X POST "$api/admin/items/warmup" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
    -H 'Content-Type: application/json' -d "{\"ids\":[$ids]}")
  put_rate=$(echo "$bulk / $bulk_put" | bc)
  warm_rate=$(echo "$bulk / $bulk_warm" | bc)
  # The sold-out path on item 1 (sold out first).
  for u in $(seq 1 11); do
    curl -s -o /dev/null -X POST "$api/api/flashbuy" -H "Authorization: Bearer $(sed -n "${u}p" "$out/catalogue-tokens.txt")" \
      -H 'Content-Type: application/json' -H "X-Client-Time: $(date +%s%3N)" -d '{"item_id":1}'
  done
  sleep 1
  rps=$(THREADS=2 TOKENS="$out/catalogue-tokens.txt" ITEM=1 MODE=random wrk -t2 -c64 -d5s \
    -s loadtest/wrk/flashbuy.lua "$api/api/flashbuy" | awk '/Requests\/sec/ {print $2}')
  rows+=("| $n | $server_cpu% | $scheduler_cpu% | $redis_share% | $(printf '%s\n' "${put[@]}" | median) | $(printf '%s\n' "${warm[@]}" | median) | $(printf '%s\n' "${stats[@]}" | median) | $(printf '%s\n' "${pause[@]}" | median) | $(printf '%s\n' "${resume[@]}" | median) | $put_rate | $warm_rate | $rps |")
done

# A sale day's set-up the bulk way: 100,000 new items written and loaded, 10,000 per call.
cleanup
"$bin" serve --roles api >"$out/catalogue-setup.log" 2>&1 &
server_pid=$!
wait_http "$api/healthz"
setup_items=${SETUP_ITEMS:-100000}
setup_start=$(date +%s.%N)
for first in $(seq 1 10000 "$setup_items"); do
  last=$((first + 9999 > setup_items ? setup_items : first + 9999))
  seq "$first" "$last" | awk -v start="$start" -v end="$end" '
    BEGIN { printf "{\"items\":[" }
    { printf "%s{\"id\":%d,\"name\":\"item %d\",\"shop_id\":%d,\"total\":100,\"start_at\":\"%s\",\"end_at\":\"%s\",\"price_cents\":1}", (NR > 1 ? "," : ""), $1, $1, 1 + $1 % 50, start, end }
    END { printf "]}" }' >"$out/catalogue-bulk.json"
  curl -fsS -o /dev/null -X PUT "$api/admin/items" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
    -H 'Content-Type: application/json' --data-binary @"$out/catalogue-bulk.json"
  loaded=$(curl -fsS -X POST "$api/admin/items/warmup" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
    -H 'Content-Type: application/json' -d "{\"ids\":[$(seq -s, "$first" "$last")]}" | grep -o '"loaded":[0-9]*')
  echo "items $first-$last: $loaded" >&2
done
setup_s=$(echo "$(date +%s.%N) - $setup_start" | bc)

cat <<REPORT | tee "$out/catalogue.md"

seckill with a large catalogue — $(nproc) cores, $(date -u +%Y-%m-%d), an API instance and a scheduler instance, idle 30 s

| items on sale | API CPU (of one core) | scheduler CPU | Redis CPU | PUT ms | warm-up ms | stats ms | pause ms | resume ms | bulk PUT items/s | bulk warm-up items/s | sold-out path req/s |
|---|---|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")

$setup_items new items (100 units each, 50 shops) written and loaded with 10,000-item bulk calls: $(printf '%.1f' "$setup_s") s
REPORT
report=$(write_report catalogue "$out/catalogue.md")
echo "written: $report" >&2
