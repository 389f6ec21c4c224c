#!/usr/bin/env bash
# The production shape on one machine: two servers (127.0.0.1:8081 and :8082, every role)
# behind nginx on 127.0.0.1:8000, which also serves the storefront. Ctrl-C stops all three.
#   ./dev/fleet.sh
#   open http://127.0.0.1:8000/?item=1001&token=$(target/release/seckill token --user 1)
#   target/release/seckill rehearse --target http://127.0.0.1:8000
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh

./dev/services.sh
./dev/tools.sh nginx
cargo build --release --locked --bin seckill
bin=target/release/seckill
export SECKILL_ADMIN_TOKEN=${SECKILL_ADMIN_TOKEN:-dev-admin-token}
"$bin" migrate

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT INT TERM
for port in 8081 8082; do
  SECKILL_HTTP_ADDR=127.0.0.1:$port "$bin" serve >"target/fleet-$port.log" &
  pids+=($!)
done
./dev/nginx.sh 127.0.0.1:8000 127.0.0.1:8081 127.0.0.1:8082 target/nginx &
pids+=($!)

for port in 8081 8082 8000; do
  wait_port "the server or nginx (target/fleet-$port.log, target/nginx)" "$port" 30
done
cat >&2 <<MSG

Two servers (logs: target/fleet-8081.log, target/fleet-8082.log) behind nginx on
http://127.0.0.1:8000. Rehearse a sale through nginx:

  SECKILL_ADMIN_TOKEN=$SECKILL_ADMIN_TOKEN $bin bench --target http://127.0.0.1:8000

Ctrl-C stops all three.
MSG
wait
