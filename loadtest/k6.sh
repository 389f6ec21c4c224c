#!/usr/bin/env bash
# The k6 plan's calibration (loadtest/k6/README.md): its ramp and spike at their defaults
# against one release server with every role on this machine, ROUNDS times, each on an
# item of its own (1,000 units, 5,000 buyers), then `seckill rehearse --requests 0` on the
# item (the invariants, once the queue has drained). The report keeps each run's p95 and
# p99 of both scenarios, the requests, the share k6 counted as failed, whether every
# threshold passed (k6 exits 99 when one fails), and whether the rehearsal said GO.
#
#   ./loadtest/k6.sh          (ROUNDS=3 by default)
#
# Uses the machine's services under the namespace and database `seckill_k6`.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

rounds=${ROUNDS:-3}
./dev/services.sh
./dev/tools.sh python-tools
cargo build --release --locked --bin seckill 2>&1 | tail -1
bin=target/release/seckill

out=loadtest/out/k6
rm -rf "$out" && mkdir -p "$out"
ns=seckill_k6
bench_env "$ns" 127.0.0.1:18079 warn
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  server_pid=
  forget "$ns"
}
cleanup
trap cleanup EXIT

"$bin" token --user 1 --count 5000 >"$out/tokens.txt"
"$bin" serve >"$out/server.log" 2>&1 &
server_pid=$!
wait_http "$api/healthz" 60 "$server_pid"

report_begin "ROUNDS=$rounds"
: >"$out/runs.jsonl"
for round in $(seq "$rounds"); do
  item=$((2000 + round))
  on_sale "$item" 1000
  echo "round $round: the ramp, then the spike, on item $item" >&2
  k6_rc=0
  .venv/bin/k6 run --quiet --summary-trend-stats "avg,p(95),p(99),max" --summary-export "$out/summary-$round.json" \
    -e BASE_URL="$api" -e ITEM="$item" -e TOKENS="$PWD/$out/tokens.txt" \
    loadtest/k6/flashbuy.js >"$out/k6-$round.txt" 2>&1 || k6_rc=$?
  [ "$k6_rc" = 0 ] || [ "$k6_rc" = 99 ] || die "k6 failed to run (exit $k6_rc); see $out/k6-$round.txt"
  go=false
  if "$bin" rehearse --target "$api" --item "$item" --requests 0 --out "$out/rehearse-$round" \
    >"$out/rehearse-$round.txt" 2>&1; then go=true; fi
  python3 - "$out/summary-$round.json" "$round" "$k6_rc" "$go" >>"$out/runs.jsonl" <<'PY'
import json, sys
summary, round_, rc, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "true"
metrics = json.load(open(summary))["metrics"]
latency = lambda scenario, p: round(metrics[f"http_req_duration{{scenario:{scenario}}}"][f"p({p})"], 2)
print(json.dumps({
    "round": round_,
    "requests": metrics["http_reqs"]["count"],
    "failed_share": metrics["http_req_failed"]["value"],
    "ramp_p95_ms": latency("ramp", 95),
    "ramp_p99_ms": latency("ramp", 99),
    "spike_p95_ms": latency("spike", 95),
    "spike_p99_ms": latency("spike", 99),
    "thresholds_passed": rc == 0,
    "rehearse_go": go,
}))
PY
  tail -1 "$out/runs.jsonl" >&2
done
report=$(write_report k6 "$out/runs.jsonl")
python3 loadtest/report.py --summary "$report"
echo "written: $report" >&2
