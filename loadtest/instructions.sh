#!/usr/bin/env bash
# Instructions per request under valgrind's callgrind: deterministic, where timings on a
# shared 2-core VM move by ±20% between runs, so a 5% change can be judged. The sold-out
# path (the crowd pressing again, and presses whose token the server has not seen yet:
# it remembers tokens that passed), the purchase path that reaches Redis (random users: wins, then duplicates), and
# loadtest/bare.rs's hello handler given the same requests, each net of what the idle
# server spends in the same time (its refresh and upkeep loops).
#
#   ./loadtest/instructions.sh        (DURATION=15s per path by default)
#   BIN=/tmp/seckill.before ./loadtest/instructions.sh   (another build of seckill)
#
# valgrind has no SHA-NI: the token's HMAC counts for more here than on the real CPU.
# Uses the machine's services under the namespace and database `seckill_instr`.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

duration=${DURATION:-15s}
users=20000
# More than wrk sends in $duration under callgrind (about 2,000 requests/s here).
first_users=$((${duration%s} * 4000))
./dev/services.sh
./dev/tools.sh wrk valgrind
cargo build --release --locked --bin seckill --example bare 2>&1 | tail -1
bin=${BIN:-target/release/seckill}

out=loadtest/out/instructions
rm -rf "$out" && mkdir -p "$out"
ns=seckill_instr
bench_env "$ns" 127.0.0.1:18085
bare_addr=127.0.0.1:18086
pids=()
report_begin "DURATION=$duration${BIN:+ BIN=$BIN}"

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  forget "$ns" "instr_bare:*"
}
cleanup
trap cleanup EXIT

under_callgrind() { # name command...
  local name=$1; shift
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$out/$name.%p" "$@" \
    >"$out/$name.log" 2>&1 &
  pids+=("$!")
}
# Instructions the process ran between a zeroing and a dump.
counted() { # pid command...
  local pid=$1; shift
  callgrind_control -z "$pid" >/dev/null
  "$@"
  callgrind_control -d "$pid" >/dev/null
  local dump
  dump=$(ls -t "$out"/*."$pid".* | head -1)
  awk '/^(summary|totals):/ {print $2; exit}' "$dump"
}
# Requests wrk completed: its output is kept for the report.
fire() { # name url [env...]
  local name=$1 url=$2; shift 2
  env THREADS=1 TOKENS="$out/tokens.txt" "$@" wrk -t1 -c4 -d"$duration" \
    -s loadtest/wrk/flashbuy.lua "$url" >"$out/$name.txt"
}
requests() { awk '/requests in/ {print $1}' "$out/$1.txt"; }
per_request() { # instructions idle requests
  echo "$(( ($1 - $2) / $3 ))"
}

echo "minting $users user tokens, and $first_users more that are each sent once" >&2
"$bin" token --user 1 --count "$users" --ttl-s 7200 >"$out/tokens.txt"
"$bin" token --user 1000001 --count "$first_users" --ttl-s 7200 \
  >"$out/first_tokens.txt"

under_callgrind seckill "$bin" serve --roles api
seckill_pid=${pids[-1]}
wait_http "$api/healthz"
# Under valgrind the server's first admin calls may take longer than the one-second
# budget, and answer 503: curl asks again (an item's PUT and its warm-up are idempotent).
admin_curl=(--retry 3)
on_sale 1 1000000
on_sale 3 1
echo "sold-out path, Redis path and an idle stretch under callgrind (${duration} each)" >&2
# Every token once, so that the crowd's presses below are repeats, as they are in a sale.
warmed=0
while [ "$warmed" -lt "$users" ]; do
  fire warm "$api/api/flashbuy" ITEM=3 MODE=sequential FIRST_USER=$warmed
  warmed=$((warmed + $(requests warm)))
done
idle=$(counted "$seckill_pid" sleep "${duration%s}")
sold_out=$(counted "$seckill_pid" fire sold_out "$api/api/flashbuy" ITEM=3 MODE=random)
first_press=$(counted "$seckill_pid" fire first_press "$api/api/flashbuy" ITEM=3 \
  MODE=sequential TOKENS="$out/first_tokens.txt")
if [ "$(requests first_press)" -gt "$first_users" ]; then
  echo "the first-press run sent some tokens twice: raise first_users" >&2
  exit 1
fi
redis_path=$(counted "$seckill_pid" fire redis_path "$api/api/flashbuy" ITEM=1 MODE=random)

under_callgrind bare target/release/examples/bare --addr "$bare_addr" --namespace instr_bare --units 1000000
bare_pid=${pids[-1]}
wait_http "http://$bare_addr/hello"
fire warm_bare "http://$bare_addr/hello" ITEM=3
bare_idle=$(counted "$bare_pid" sleep "${duration%s}")
hello=$(counted "$bare_pid" fire hello "http://$bare_addr/hello" ITEM=3)
grab=$(counted "$bare_pid" fire bare_grab "http://$bare_addr/grab" ITEM=1 MODE=random BARE_USERS=$users)

cat <<REPORT | tee "$out/instructions.md"

instructions per request (callgrind, $(date -u +%Y-%m-%d); wrk -t1 -c4 -d$duration; net of idle)

| path                                   | instructions | requests |
|----------------------------------------|--------------|----------|
| seckill, sold out (from memory)        | $(per_request "$sold_out" "$idle" "$(requests sold_out)") | $(requests sold_out) |
| seckill, sold out, each token new      | $(per_request "$first_press" "$idle" "$(requests first_press)") | $(requests first_press) |
| seckill, Redis path (wins+duplicates)  | $(per_request "$redis_path" "$idle" "$(requests redis_path)") | $(requests redis_path) |
| bare hello handler (same requests)     | $(per_request "$hello" "$bare_idle" "$(requests hello)") | $(requests hello) |
| bare grab.lua server                   | $(per_request "$grab" "$bare_idle" "$(requests bare_grab)") | $(requests bare_grab) |
REPORT
report=$(write_report instructions "$out/instructions.md")
echo "written: $report" >&2
