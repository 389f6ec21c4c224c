#!/usr/bin/env bash
# A draw among a million entries: tests/it/draws.rs's `a_million_entries` (an item of 1,000
# units over 16 buckets, a million entries written straight into the buckets' sorted sets,
# then the draw by one server with every role), run ROUNDS times in a release build. Each
# run asserts that the 1,000 lowest ranks won; the report keeps every run's figures: the
# seconds entering took, the Redis memory the entries took, and from `draw_at` to the seed's
# publication and to the last winner's order in MySQL.
#
#   ./loadtest/draw.sh         (ROUNDS=3 by default)
#
# The test makes and removes its own namespace and database on the machine's services.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

rounds=${ROUNDS:-3}
./dev/services.sh
echo "building the tests (release)" >&2
cargo test --release --locked --test it --no-run 2>&1 | tail -1

out=loadtest/out/draw
rm -rf "$out" && mkdir -p "$out"
REPORT_MEASURES_TESTS=1 report_begin "ROUNDS=$rounds"
for round in $(seq "$rounds"); do
  echo "round $round: a million entries, then the draw" >&2
  cargo test --release --locked --test it draws::a_million_entries -- --ignored --exact --nocapture \
    >"$out/run-$round.log" 2>&1 || die "the draw's run $round failed; see $out/run-$round.log"
  sed -n 's/^draw figures: //p' "$out/run-$round.log" >>"$out/runs.jsonl"
  tail -1 "$out/runs.jsonl" >&2
done
[ "$(wc -l <"$out/runs.jsonl")" = "$rounds" ] || die "not every run printed its figures; see $out/run-*.log"
report=$(write_report draw "$out/runs.jsonl")
python3 loadtest/report.py --summary "$report"
echo "written: $report" >&2
