#!/usr/bin/env bash
# Where a purchase's CPU goes: the Redis path (random users out of 200,000 on an item with
# 400,000 units: wins and duplicates) against seckill (API and scheduler, publishing to
# RabbitMQ, no consumer) and against loadtest/bare.rs's `grab.lua` handler, each with its
# own private Redis, and the µs of CPU per request each process — and each of seckill's
# threads, by name — spent (from /proc/<pid>/stat and /proc/<pid>/task/*/stat before and
# after), with the system calls per request of both servers (`perf stat` on the syscall
# tracepoints, when perf is there). bench.sh tells how far apart the two are; this tells
# where. The runs go seckill, bare, bare, seckill in each of ROUNDS rounds, each run on an
# item of its own (a buyer of an earlier run would only be a duplicate); the report gives
# each round's ratio of the server's, Redis's and the rate's figures, their median and range.
#
#   ./loadtest/cpu_split.sh          (DURATION=10s ROUNDS=3 by default)
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
rounds=${ROUNDS:-3}
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

bare_pid=
cleanup() {
  for pid in "${pids[@]}" $bare_pid; do kill "$pid" 2>/dev/null || true; done
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

# One measured run: wrk on URL while PID (and REDIS_PID) are watched; its figures (req/s,
# p99, µs of CPU a request of the server, Redis, RabbitMQ and each of the server's thread
# names) are appended to $out/runs.tsv, the way loadtest/report.py reads them.
measure() { # round name url pid redis_pid [env...]
  local round=$1 name=$2 url=$3 pid=$4 redis_pid=$5 rabbit_pid file
  shift 5
  # Numbered: a name runs twice a round, and each run's outputs are kept.
  file=$(printf '%s/%03d-%s-%s' "$out" "$run_count" "$name" "$round")
  rabbit_pid=$(pgrep -f beam.smp | head -1 || true)
  threads "$pid" >"$file.threads0"
  local s0 r0 b0=0 s1 r1 b1=0
  s0=$(ticks /proc/"$pid"/stat) r0=$(ticks /proc/"$redis_pid"/stat)
  [ -n "$rabbit_pid" ] && b0=$(ticks /proc/"$rabbit_pid"/stat)
  syscalls "$pid" "$file.syscalls" &
  local counting=$!
  env "$@" THREADS=2 TOKENS="$out/tokens.txt" MODE=random \
    wrk -t2 -c64 -d"$duration" --latency -s loadtest/wrk/flashbuy.lua "$url" >"$file.wrk"
  wait "$counting"
  s1=$(ticks /proc/"$pid"/stat) r1=$(ticks /proc/"$redis_pid"/stat)
  [ -n "$rabbit_pid" ] && b1=$(ticks /proc/"$rabbit_pid"/stat)
  threads "$pid" >"$file.threads1"
  local requests
  requests=$(awk '/requests in/ {print $1}' "$file.wrk")
  {
    printf '%s\t%s\t%s\t%s' "$round" "$name" $(wrk_rps_p99 "$file.wrk")
    printf '\tserver_us=%s\tredis_us=%s' "$(cpu_us_per_request $((s1 - s0)) "$requests")" "$(cpu_us_per_request $((r1 - r0)) "$requests")"
    if [ "$name" = seckill ]; then
      printf '\trabbitmq_us=%s' "$(cpu_us_per_request $((b1 - b0)) "$requests")"
      join "$file.threads0" "$file.threads1" | while read -r thread before after; do
        printf '\t%s_us=%s' "$thread" "$(cpu_us_per_request $((after - before)) "$requests")"
      done
    fi
    echo
  } >>"$out/runs.tsv"
  echo "round $round: $name $(tail -1 "$out/runs.tsv" | cut -f3-)" >&2
}
# The syscalls file as "writev 1.47, recvfrom 1.01, …" per request.
syscalls_per_request() { # file seconds_counted wrk_file
  [ -s "$1" ] || { echo "(perf not available)"; return; }
  awk -F, -v n="$(echo "$2 * $(awk '/Requests\/sec/ {print $2}' "$3")" | bc)" '/sys_enter_/ {
      sub(/.*sys_enter_/, "", $3); printf "%s%s %.2f", sep, $3, $1 / n; sep = ", " }
    END {print ""}' "$1"
}

echo "minting $users user tokens" >&2
"$bin" token --user 1 --count "$users" --ttl-s 7200 >"$out/tokens.txt"

redis_pid=$(start_redis $seckill_redis)
bare_redis_pid=$(start_redis $bare_redis)
# seckill runs throughout (idle during the bare server's runs: its upkeep loops cost about
# 2% of a core); the bare server is started for each of its runs, on a namespace of its own.
SECKILL_REDIS_URL=redis://127.0.0.1:$seckill_redis "$bin" serve --roles api,scheduler \
  >"$out/seckill.log" 2>&1 &
seckill_pid=$!
pids+=("$seckill_pid")
wait_http "$api/healthz"

report_begin "DURATION=$duration ROUNDS=$rounds${BIN:+ BIN=$BIN}"
: >"$out/runs.tsv"
run_count=0
run() { # round name
  run_count=$((run_count + 1))
  case $2 in
    seckill)
      on_sale "$run_count" 400000
      sleep 2
      measure "$1" seckill "$api/api/flashbuy" "$seckill_pid" "$redis_pid" ITEM="$run_count"
      ;;
    bare)
      target/release/examples/bare --addr "$bare_addr" --redis "redis://127.0.0.1:$bare_redis" \
        --namespace "bench_bare_$run_count" --units 400000 >"$out/bare-$run_count.log" 2>&1 &
      bare_pid=$!
      wait_http "http://$bare_addr/hello" 60 "$bare_pid"
      sleep 2
      measure "$1" bare "http://$bare_addr/grab" "$bare_pid" "$bare_redis_pid" ITEM=1 BARE_USERS=$users
      kill "$bare_pid"
      wait "$bare_pid" 2>/dev/null || true
      bare_pid=
      ;;
  esac
}
for round in $(seq "$rounds"); do
  for name in seckill bare bare seckill; do run "$round" "$name"; done
done

cat >"$out/figures.json" <<JSON
{"wrk": "-t2 -c64 -d$duration", "rounds": $rounds, "buyers": $users, "units_a_run": 400000}
JSON
report=$(write_report cpu_split "$out/figures.json" "$out/runs.tsv" \
  "server CPU a request, seckill / bare grab.lua server=seckill/bare:server_us" \
  "Redis CPU a request, seckill / bare grab.lua server=seckill/bare:redis_us" \
  "requests a second, seckill / bare grab.lua server=seckill/bare")
python3 loadtest/report.py --summary "$report"
echo "system calls per request (round 1) — seckill: $(syscalls_per_request "$out/001-seckill-1.syscalls" 3 "$out/001-seckill-1.wrk")" >&2
echo "                                      bare:    $(syscalls_per_request "$out/002-bare-1.syscalls" 3 "$out/002-bare-1.wrk")" >&2
echo "written: $report" >&2
