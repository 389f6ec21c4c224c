#!/usr/bin/env bash
# The crowd's answer when the crowd is large: one server (api + scheduler) with an item
# sold out, `wrk -t2 -c64` pressing it for 10 s over 200,000 tokens at random, then 10 s
# more, and the server's µs of CPU per answer in each (from /proc/<pid>/stat), with its
# peak memory. The second 10 s is the crowd pressing again, as it does after a sell-out:
# what the server remembers of the tokens it verified shows there.
#
#   ./loadtest/sold_out_crowd.sh
#   BIN=/tmp/seckill.before ./loadtest/sold_out_crowd.sh   (another build, to alternate
#                                    with the tree's own, run for run)
#
# Writes loadtest/out/sold_out_crowd/sold_out_crowd.json (loadtest/report.py). Uses a
# private Redis on port 16605 and the machine's MariaDB and RabbitMQ under the namespace
# and database `seckill_crowd`.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

users=200000
./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill 2>&1 | tail -1
bin=${BIN:-target/release/seckill}

out=loadtest/out/sold_out_crowd
rm -rf "$out" && mkdir -p "$out"
# The one unit goes to the first press: from then on every answer is `410`.
sold_out_server seckill_crowd 127.0.0.1:18093 16605

report_begin "${BIN:+BIN=$BIN}"
rounds=()
for round in first again; do
  echo "the sold-out path for 10 s ($round)" >&2
  t0=$(ticks /proc/"$api_pid"/stat)
  THREADS=2 TOKENS="$out/tokens.txt" ITEM=3 MODE=random \
    wrk -t2 -c64 -d10s --latency -s loadtest/wrk/flashbuy.lua "$api/api/flashbuy" >"$out/$round.txt"
  t1=$(ticks /proc/"$api_pid"/stat)
  requests=$(awk '/requests in/ {print $1}' "$out/$round.txt")
  rps=$(awk '/Requests\/sec/ {print $2}' "$out/$round.txt")
  us=$(cpu_us_per_request $((t1 - t0)) "$requests")
  printf '%-6s %10s req/s  %6s µs of CPU an answer\n' "$round" "$rps" "$us"
  rounds+=("{\"crowd\": \"$round\", \"requests_per_s\": $rps, \"server_cpu_us_per_answer\": $us}")
done
peak_kb=$(awk '/VmHWM/ {print $2}' /proc/"$api_pid"/status)
echo "peak memory (VmHWM): $peak_kb kB"
IFS=,
echo "{\"buyers\": $users, \"wrk\": \"-t2 -c64 -d10s\", \"rounds\": [${rounds[*]}], \"server_peak_kb\": $peak_kb}" >"$out/figures.json"
unset IFS
report=$(write_report sold_out_crowd "$out/figures.json")
echo "written: $report" >&2
