#!/usr/bin/env bash
# Where a purchase's CPU goes: the Redis path (random users out of 200,000 on an item with
# 400,000 units: wins and duplicates) against seckill (API and scheduler, publishing to
# RabbitMQ, no consumer) and then against loadtest/bare.rs's `grab.lua` handler, each with
# its own private Redis, and the µs of CPU per request each process — and each of
# seckill's threads, by name — spent (from /proc/<pid>/stat and /proc/<pid>/task/*/stat
# before and after), with the system calls per request of both servers (`perf stat` on
# the syscall tracepoints, when perf is there). bench.sh tells how far apart the two are;
# this tells where.
#
#   ./loadtest/cpu_split.sh          (DURATION=10s by default)
#   BIN=/tmp/seckill.before ./loadtest/cpu_split.sh   (another build of seckill, to compare:
#                                    alternate it with the tree's own, run for run)
#
# Writes loadtest/out/cpu_split/cpu_split.json (loadtest/report.py: the commit, the
# machine and its steal time beside the figures). Uses the machine's MariaDB and RabbitMQ
# under the namespace and database `seckill_cpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/lib.sh

duration=${DURATION:-10s}
users=200000
./dev/services.sh
./dev/tools.sh wrk
cargo build --release --locked --bin seckill --example bare 2>&1 | tail -1
bin=${BIN:-target/release/seckill}

out=loadtest/out/cpu_split
rm -rf "$out" && mkdir -p "$out"
ns=seckill_cpu
bench_env "$ns" 127.0.0.1:18091
bare_addr=127.0.0.1:18092
seckill_redis=16603
bare_redis=16604
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for port in $seckill_redis $bare_redis; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
  forget "$ns"
}
cleanup
trap cleanup EXIT

# A private Redis on a port, and its pid.
start_redis() { # port
  private_redis "$1" "$out"
  pgrep -f "redis-server 127.0.0.1:$1"
}
# "name ticks" for each of a process's threads, summed by name.
threads() {
  for task in /proc/"$1"/task/*; do
    echo "$(tr -d ' ' <"$task/comm") $(ticks "$task/stat")"
  done | awk '{t[$1] += $2} END {for (n in t) print n, t[n]}' | sort
}
# The system calls the process makes per second, counted for 3 s in the middle of a run.
syscalls() { # pid file
  command -v perf >/dev/null || return 0
  sleep 3
  perf stat -x, -e syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_recvfrom,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield \
    -p "$1" -o "$2" -- sleep 3 >/dev/null 2>&1 || true
}

# One measured run: wrk on URL while PID (and REDIS_PID) are watched. Sets `requests`,
# `rps` and the tick deltas `d_server`, `d_redis`, `d_rabbit`.
measure() { # name url pid redis_pid [env...]
  local name=$1 url=$2 pid=$3 redis_pid=$4 rabbit_pid
  shift 4
  rabbit_pid=$(pgrep -f beam.smp | head -1 || true)
  threads "$pid" >"$out/$name.threads0"
  local s0 r0 b0=0 s1 r1 b1=0
  s0=$(ticks /proc/"$pid"/stat) r0=$(ticks /proc/"$redis_pid"/stat)
  [ -n "$rabbit_pid" ] && b0=$(ticks /proc/"$rabbit_pid"/stat)
  syscalls "$pid" "$out/$name.syscalls" &
  local counting=$!
  env "$@" THREADS=2 TOKENS="$out/tokens.txt" ITEM=1 MODE=random \
    wrk -t2 -c64 -d"$duration" -s loadtest/wrk/flashbuy.lua "$url" >"$out/$name.wrk"
  wait "$counting"
  s1=$(ticks /proc/"$pid"/stat) r1=$(ticks /proc/"$redis_pid"/stat)
  [ -n "$rabbit_pid" ] && b1=$(ticks /proc/"$rabbit_pid"/stat)
  threads "$pid" >"$out/$name.threads1"
  requests=$(awk '/requests in/ {print $1}' "$out/$name.wrk")
  rps=$(awk '/Requests\/sec/ {print $2}' "$out/$name.wrk")
  d_server=$((s1 - s0)) d_redis=$((r1 - r0)) d_rabbit=$((b1 - b0))
}
# The syscalls file as "writev 1.47, recvfrom 1.01, …" per request.
syscalls_per_request() { # file seconds_counted requests_per_second
  [ -s "$1" ] || { echo "(perf not available)"; return; }
  awk -F, -v n="$(echo "$2 * $3" | bc)" '/sys_enter_/ {
      sub(/.*sys_enter_/, "", $3); printf "%s%s %.2f", sep, $3, $1 / n; sep = ", " }
    END {print ""}' "$1"
}

echo "minting $users user tokens" >&2
"$bin" token --user 1 --count "$users" --ttl-s 7200 >"$out/tokens.txt"

report_begin "DURATION=$duration${BIN:+ BIN=$BIN}"
echo "seckill: the Redis path for $duration" >&2
redis_pid=$(start_redis $seckill_redis)
SECKILL_REDIS_URL=redis://127.0.0.1:$seckill_redis "$bin" serve --roles api,scheduler \
  >"$out/seckill.log" 2>&1 &
seckill_pid=$!
pids+=("$seckill_pid")
wait_http "$api/healthz"
on_sale 1 400000
sleep 2
measure seckill "$api/api/flashbuy" "$seckill_pid" "$redis_pid"
s_requests=$requests s_rps=$rps s_server=$d_server s_redis=$d_redis s_rabbit=$d_rabbit
kill "$seckill_pid"

echo "the bare grab.lua server: the same requests for $duration" >&2
bare_redis_pid=$(start_redis $bare_redis)
target/release/examples/bare --addr "$bare_addr" --redis "redis://127.0.0.1:$bare_redis" \
  --namespace bench_bare --units 400000 >"$out/bare.log" 2>&1 &
bare_pid=$!
pids+=("$bare_pid")
wait_http "http://$bare_addr/hello"
sleep 2
measure bare "http://$bare_addr/grab" "$bare_pid" "$bare_redis_pid" BARE_USERS=$users
b_requests=$requests b_rps=$rps b_server=$d_server b_redis=$d_redis

us() { cpu_us_per_request "$1" "$2"; }
threads=$(join "$out/seckill.threads0" "$out/seckill.threads1" | while read -r name before after; do
  printf '%s"%s": %s' "${sep:-}" "$name" "$(us $((after - before)) "$s_requests")"
  sep=", "
done)
cat >"$out/figures.json" <<JSON
{"wrk": "-t2 -c64 -d$duration", "buyers": $users,
 "us_of_cpu_a_request": {
   "seckill": {"server": $(us "$s_server" "$s_requests"), "redis": $(us "$s_redis" "$s_requests"), "rabbitmq": $(us "$s_rabbit" "$s_requests"), "threads": {$threads}},
   "bare_grab": {"server": $(us "$b_server" "$b_requests"), "redis": $(us "$b_redis" "$b_requests")}},
 "requests_per_s": {"seckill": $s_rps, "bare_grab": $b_rps}}
JSON
report=$(write_report cpu_split "$out/figures.json")
echo "written: $report" >&2
cat <<REPORT

Where a purchase's CPU goes — $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), wrk -t2 -c64 -d$duration, the Redis path

| µs of CPU per request                 | seckill | bare grab.lua server |
|---------------------------------------|---------|----------------------|
| the server                            | $(cpu_us_per_request "$s_server" "$s_requests") | $(cpu_us_per_request "$b_server" "$b_requests") |
$(join "$out/seckill.threads0" "$out/seckill.threads1" | while read -r name before after; do
  printf '| - its %-31s | %s | |\n' "$name threads" "$(cpu_us_per_request $((after - before)) "$s_requests")"
done)
| Redis                                 | $(cpu_us_per_request "$s_redis" "$s_requests") | $(cpu_us_per_request "$b_redis" "$b_requests") |
| RabbitMQ                              | $(cpu_us_per_request "$s_rabbit" "$s_requests") | — |
| req/s                                 | $s_rps | $b_rps |

system calls per request — seckill: $(syscalls_per_request "$out/seckill.syscalls" 3 "$s_rps")
                            bare:    $(syscalls_per_request "$out/bare.syscalls" 3 "$b_rps")
REPORT
