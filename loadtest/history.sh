#!/usr/bin/env bash
# Months of sales behind one API instance: 100,000 ended (and retired) items in MySQL
# beside 1,000 live ones, and an unauthenticated client walking every old id with
# `GET /api/items/{id}`, twice over. Before and after each walk: the instance's RSS, the items its
# catalogue holds (`seckill_catalogue_items`), and its CPU while idle — the half-second
# stock pass and the definitions' refresh — as a share of one core over 20 s. Flat is the
# goal: memory and the stock pass must not follow the history.
#
#   ./loadtest/history.sh         (OLD=100000 LIVE=1000 WALK=30s; BIN=… another build)
#
# Uses the machine's services under the namespace and database `seckill_history_bench`,
# emptied before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

old=${OLD:-100000}
live=${LIVE:-1000}
walk=${WALK:-30s}
./dev/services.sh
./dev/tools.sh wrk
bin=${BIN:-target/release/seckill}
if [ -z "${BIN:-}" ]; then cargo build --release --locked --bin seckill 2>&1 | tail -1; fi

out=loadtest/out
mkdir -p "$out"
ns=seckill_history_bench
bench_env "$ns" 127.0.0.1:18097 warn
# The walker is one address: the per-address read limit would stop it at once.
export SECKILL_READ_RATE_PER_IP=0
report_begin "OLD=$old LIVE=$live WALK=$walk${BIN:+ BIN=$BIN}"
server_pid=

cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  server_pid=
  forget "$ns"
}
trap cleanup EXIT

rss_mb() { awk '/^VmRSS:/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
catalogue() { curl -fs "$api/metrics" | awk -v kind="$1" '$0 ~ "^seckill_catalogue_items" && $0 ~ "kind=\"" kind "\"" {print $2}'; }
# The API process's CPU over 20 s of nothing, as a share of one core.
idle_cpu() {
  local t0 t1 s0 s1
  t0=$(awk '{print $14 + $15}' "/proc/$server_pid/stat"); s0=$(date +%s.%N)
  sleep 20
  t1=$(awk '{print $14 + $15}' "/proc/$server_pid/stat"); s1=$(date +%s.%N)
  echo "scale=2; 100 * ($t1 - $t0) / $(getconf CLK_TCK) / ($s1 - $s0)" | bc
}

cleanup
"$bin" serve --roles api >"$out/history.log" 2>&1 &
server_pid=$!
wait_http "$api/healthz"
start=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
# The live items the operators' way: written and loaded in bulk calls.
seq 1 "$live" | awk -v start="$start" -v end="$end" '
  BEGIN { printf "{\"items\":[" }
  { printf "%s{\"id\":%d,\"name\":\"live %d\",\"shop_id\":1,\"total\":10,\"start_at\":\"%s\",\"end_at\":\"%s\",\"price_cents\":1}", (NR > 1 ? "," : ""), $1, $1, start, end }
  END { printf "]}" }' >"$out/history-live.json"
curl -fsS -o /dev/null -X PUT "$api/admin/items" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
  -H 'Content-Type: application/json' --data-binary @"$out/history-live.json"
curl -fsS -o /dev/null -X POST "$api/admin/items/warmup" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
  -H 'Content-Type: application/json' -d "{\"ids\":[$(seq -s, 1 "$live")]}"
# The history, as retirement leaves it: ended a month ago, reconciled, retired, cleared.
first_old=1000001
echo "writing $old ended and retired items into MySQL" >&2
mariadb -h 127.0.0.1 -u root "$ns" -e "
  INSERT INTO items (id, shop_id, name, total, price_cents, start_at, end_at, buckets,
                     loaded_at, reconciled_at, retired_at, unsold, redis_cleared_at)
  SELECT seq, 1, CONCAT('old ', seq), 100, 100,
         UTC_TIMESTAMP(3) - INTERVAL 31 DAY, UTC_TIMESTAMP(3) - INTERVAL 30 DAY, 1 + seq % 4,
         UTC_TIMESTAMP(3) - INTERVAL 31 DAY, UTC_TIMESTAMP(3) - INTERVAL 30 DAY,
         UTC_TIMESTAMP(3) - INTERVAL 29 DAY, 0, UTC_TIMESTAMP(3) - INTERVAL 29 DAY
  FROM seq_${first_old}_to_$((first_old + old - 1))"
# Settle (a full read of the definitions included).
sleep 35
rss0=$(rss_mb "$server_pid"); current0=$(catalogue current); others0=$(catalogue others)
cpu0=$(idle_cpu)

cat >"$out/history-walk.lua" <<LUA
-- Each thread walks every old id in turn.
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/api/items/" .. ($first_old + n % $old))
end
LUA
# Two walks: the first brings every old id in once; the second shows whether that stays.
walk_once() {
  wrk -t2 -c32 -d"$walk" -s "$out/history-walk.lua" "$api" | tee "$out/history-walk.txt" >/dev/null
  walked+=("$(awk '/requests in/ {print $1}' "$out/history-walk.txt") GETs, $(awk '/Requests\/sec/ {printf "%.0f", $2}' "$out/history-walk.txt") req/s")
}
walked=()
walk_once
rss1=$(rss_mb "$server_pid"); current1=$(catalogue current); others1=$(catalogue others)
walk_once
rss2=$(rss_mb "$server_pid"); current2=$(catalogue current); others2=$(catalogue others)
sleep 5
cpu1=$(idle_cpu)
rss3=$(rss_mb "$server_pid")

cat <<REPORT | tee "$out/history.md"

seckill with a long history — $(nproc) cores, $(date -u +%Y-%m-%d), one API instance ($bin)
$live live items, $old ended and retired items; two walks over the old ids, $walk each: ${walked[0]}; ${walked[1]}

| | before | after the first walk | after the second | idle after |
|---|---|---|---|---|
| RSS | $rss0 MB | $rss1 MB | $rss2 MB | $rss3 MB |
| catalogue: current items | $current0 | $current1 | $current2 | |
| catalogue: older items cached | $others0 | $others1 | $others2 | |
| CPU while idle (stock pass, refresh), of one core | $cpu0% | | | $cpu1% |
REPORT
report=$(write_report history "$out/history.md")
echo "written: $report" >&2
