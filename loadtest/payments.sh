#!/usr/bin/env bash
# Payment events applied per second, as a ratio to a yardstick in the same run: the whole
# server (API, consumer, scheduler) sells ORDERS units to as many buyers, then, in ROUNDS
# slices of them, the owners read their orders (GET /api/orders/{sn}: one MySQL lookup) and
# the provider pays them (a signed payment.succeeded each: one MySQL transaction with the
# event recorded, the order locked and paid), the two in turn first (loadtest/payments.rs).
#
#   ./loadtest/payments.sh          (ORDERS=6000 ROUNDS=3 by default)
#
# Writes loadtest/out/payments/payments.json (loadtest/report.py: the commit, the machine
# and its steal time beside every round). Uses the machine's services under the namespace and
# database `seckill_payments_bench`, emptied before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

orders=${ORDERS:-6000}
rounds=${ROUNDS:-3}
./dev/services.sh
cargo build --release --locked --bin seckill --example payments 2>&1 | tail -1

out=loadtest/out/payments
rm -rf "$out" && mkdir -p "$out"
ns=seckill_payments_bench
bench_env "$ns" 127.0.0.1:18097 warn
export SECKILL_PAYMENT_SECRET=bench-payment-secret
bin=target/release/seckill
server_pid=
cleanup() {
  [ -n "$server_pid" ] && { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
  forget "$ns"
}
trap cleanup EXIT
forget "$ns"

"$bin" token --user 1 --count "$orders" --ttl-s 7200 >"$out/payments-tokens.txt"
"$bin" serve >"$out/payments-server.log" 2>&1 &
server_pid=$!
wait_http "$api/healthz" 60 "$server_pid"
on_sale 1 "$orders"
log "selling $orders units, then paying them in $rounds rounds"
report_begin "ORDERS=$orders ROUNDS=$rounds"
target/release/examples/payments "$api" "$SECKILL_ADMIN_TOKEN" "$SECKILL_PAYMENT_SECRET" \
  "$out/payments-tokens.txt" 1 "$rounds" >"$out/figures.json"
report=$(write_report payments "$out/figures.json")
cat "$report"
log "written: $report"
