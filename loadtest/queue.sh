#!/usr/bin/env bash
# What a waiting room costs Redis, on a private Redis (port 16401) nothing else uses:
# a million buyers joining one item's pre-queue, reads of their places, and admission at
# 10,000 a second (loadtest/queue.rs says how each figure is taken). Writes
# loadtest/out/queue/queue.json (loadtest/report.py: the commit, the machine and its steal
# time beside the figures).
#
#   ./loadtest/queue.sh                 (BUYERS=1000000 READS=100000 ADMIT_PER_S=10000)
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

port=16401
buyers=${BUYERS:-1000000}
reads=${READS:-100000}
admit=${ADMIT_PER_S:-10000}
cargo build --release --locked --example queue 2>&1 | tail -1
out=loadtest/out/queue
rm -rf "$out" && mkdir -p "$out"
private() { redis-cli -p "$port" "$@"; }
cleanup() { private shutdown nosave >/dev/null 2>&1 || true; }
cleanup
trap cleanup EXIT
private_redis "$port" "$out"

report_begin "BUYERS=$buyers READS=$reads ADMIT_PER_S=$admit"
echo "$buyers joins, $reads reads, admission at $admit a second" >&2
target/release/examples/queue --redis "redis://127.0.0.1:$port" --buyers "$buyers" \
  --reads "$reads" --admit-per-s "$admit" >"$out/figures.json"
report=$(write_report queue "$out/figures.json")
cat "$report"
