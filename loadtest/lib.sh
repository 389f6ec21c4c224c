# Shared by the load-test scripts (sourced from the repository's top): dev/lib.sh (messages,
# waiting for a port or URL, `admin`), leaving no trace of a run's namespace in the
# machine's MariaDB, Redis and RabbitMQ, putting an item on sale, and a process's CPU.
. dev/lib.sh

# bench_env NAMESPACE HTTP_ADDR [LOG_LEVEL]: the settings every load-test server runs with —
# its own namespace and database (emptied by `forget`), the admin token the scripts send,
# the address it listens on, and RUST_LOG unless the caller set one (LOG_LEVEL, `info` by
# default). Every tuning setting stays at its default — the per-user purchase limit
# included (5 a second: the crowds here spread their presses over 200,000–300,000 tokens); a
# script that changes one says so in its report (`changed_settings`). Also sets `api`.
bench_env() {
  export SECKILL_NAMESPACE=$1
  export SECKILL_DATABASE_URL="mysql://root@127.0.0.1:3306/$1"
  export SECKILL_ADMIN_TOKEN=bench-admin
  export SECKILL_HTTP_ADDR=$2
  export RUST_LOG=${RUST_LOG:-${3:-info}}
  api="http://$2"
}

# changed_settings: the SECKILL_* settings this shell exports, as a JSON object, but those
# that only say where things are or unlock them (stores, addresses, namespace, tokens,
# secrets, passwords): what a report prints beside its figures, so a figure taken off the
# defaults says which.
changed_settings() {
  python3 -c '
import json, os, re
# Where things are and what unlocks them say nothing of the figures, and must not be
# committed in a report.
left_out = re.compile(r"SECKILL_(NAMESPACE|DATABASE_URL|.*_URL|.*_ADDR|.*_TOKEN|.*_SECRET|.*_PASSWORD)$")
print(json.dumps({k: v for k, v in sorted(os.environ.items())
                  if k.startswith("SECKILL_") and not left_out.match(k)}))'
}

# private_redis PORT DIR: a Redis of the load test's own on PORT, with the deployment's
# settings (REDIS_SALE_SETTINGS in dev/lib.sh), no persistence, its log in DIR/redis-PORT.log;
# returns once it answers. Stop it with `redis-cli -p PORT shutdown nosave`.
private_redis() {
  redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no --dir "$PWD/$2" \
    --logfile "$PWD/$2/redis-$1.log" "${REDIS_SALE_SETTINGS[@]}" --daemonize yes >/dev/null
  wait_until 5 redis-cli -p "$1" ping || die "the private Redis on port $1 did not start; see $2/redis-$1.log"
}

# forget NAMESPACE [REDIS_PATTERN...]: drops its database, its Redis keys (and those of
# the extra patterns) and its order queues.
forget() {
  local ns=$1 pattern
  shift
  mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS \`$ns\`" 2>/dev/null || true
  for pattern in "$ns:*" "$@"; do
    redis-cli --scan --pattern "$pattern" | xargs -r -n 1000 redis-cli del >/dev/null || true
  done
  if command -v rabbitmqctl >/dev/null; then
    for q in "$ns.orders" "$ns.orders.dead"; do rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true; done
  fi
}

# on_sale ID TOTAL: puts the item on sale from a minute ago for a day and loads its units.
on_sale() {
  local start end
  start=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
  end=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
  admin PUT "/admin/items/$1" "{\"name\":\"load test $1\",\"shop_id\":1,\"total\":$2,\"start_at\":\"$start\",\"end_at\":\"$end\",\"price_cents\":1}" >/dev/null
  admin POST "/admin/items/$1/warmup" >/dev/null
}

# callgrind_redis DIR REDIS_ARGS...: starts redis-server under valgrind's callgrind (in
# the background, its log and dumps in DIR) and sets `callgrind_pid`. Counting its
# instructions instead of timing it gives the same figure on every run.
callgrind_redis() {
  local dir=$1
  shift
  ./dev/tools.sh valgrind
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.%n" \
    redis-server "$@" >"$dir/valgrind.log" 2>&1 &
  callgrind_pid=$!
  callgrind_dir=$dir
}

# callgrind_since: the instructions the Redis of `callgrind_redis` ran since the last call
# (or its start), then counts afresh.
callgrind_since() {
  callgrind_control -d "$callgrind_pid" >/dev/null 2>&1
  awk '/^(summary|totals):/ {print $2; exit}' "$(ls -t "$callgrind_dir"/callgrind.* | head -1)"
  callgrind_control -z "$callgrind_pid" >/dev/null 2>&1
}

# Mints $users tokens into $out/tokens.txt, then starts `$bin serve --roles api,scheduler`
# (its log in $out/api.log), adds it to `pids` and waits until it answers: its pid in
# `api_pid`.
tokens_and_api() {
  echo "minting $users user tokens" >&2
  "$bin" token --user 1 --count "$users" --ttl-s 7200 >"$out/tokens.txt"
  "$bin" serve --roles api,scheduler >"$out/api.log" 2>&1 &
  api_pid=$!
  pids+=("$api_pid")
  wait_http "$api/healthz"
}

# report_begin KNOBS: marks where a script's measured part begins (the report's start and
# its steal time count from here); KNOBS are the variables the run was given, as a reader
# would type them before the command (`DURATION=10s ROUNDS=3`).
report_begin() {
  report_command="${1:+$1 }./loadtest/$(basename "$0")"
  report_stat0=$(head -1 /proc/stat)
  report_began=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # The code measured: the commit when the run began, and whether anything measured
  # (docs, tests and reports left out) differed from it.
  report_commit=$(git rev-parse HEAD)
  # New files count too (a script not yet committed); tests only where the script measures
  # a test (REPORT_MEASURES_TESTS=1, as draw.sh does).
  local leave_out=(':!docs' ':!*.md' ':!loadtest/results')
  [ "${REPORT_MEASURES_TESTS:-0}" = 1 ] || leave_out+=(':!tests')
  report_tree_changed=$(git status --porcelain --untracked-files=all -- . "${leave_out[@]}" | wc -l)
}

# write_report NAME FIGURES_JSON [RUNS_TSV RATIO...]: writes $out/NAME.json through
# loadtest/report.py — the command that ran, the commit, the machine (nproc, CPU model, the
# time the hypervisor stole), every setting off its default, then the figures, each round's
# and each ratio's median and range — and prints its path. The reports the docs cite are
# copied to loadtest/results/NAME-DATE.json and committed.
write_report() {
  local name=$1
  shift
  REPORT_COMMAND=$report_command REPORT_BEGAN=$report_began REPORT_STAT0=$report_stat0 \
    REPORT_SETTINGS=$(changed_settings) REPORT_COMMIT=$report_commit \
    REPORT_TREE_CHANGED=$report_tree_changed \
    python3 loadtest/report.py "$@" >"$out/$name.json" ||
    { rm -f "$out/$name.json"; die "loadtest/report.py could not write $out/$name.json (its figures: $2)"; }
  echo "$out/$name.json"
}

# wrk_ms LATENCY: one of wrk's latencies (`850.00us`, `14.92ms`, `1.02s`) in ms.
wrk_ms() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /[0-9]s$/) n *= 1000; print n }'; }
# wrk_rps_p99 FILE: "requests_per_second p99_ms" from a wrk report run with --latency.
wrk_rps_p99() {
  echo "$(awk '/Requests\/sec/ {print $2}' "$1") $(wrk_ms "$(awk '/^ +99%/ {print $2}' "$1")")"
}

# Clock ticks (user + system) a process, or one thread, has used: ticks /proc/PID/stat.
ticks() { awk '{print $14 + $15}' "$1"; }
# cpu_us_per_request TICKS REQUESTS: the µs of CPU those ticks were, per request.
cpu_us_per_request() {
  awk -v t="$1" -v n="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}'
}

# sold_out_server NAMESPACE HTTP_ADDR REDIS_PORT [LOG_LEVEL]: what the crowd scripts start
# from — the load-test settings (bench_env), a private Redis on REDIS_PORT, $users tokens
# and one server (tokens_and_api, into $out), and item 3 of one unit sold to the first
# press, so that every press of it after is answered `410` from memory. All of it goes
# again when the script exits (and anything a run before left behind goes first).
sold_out_server() {
  ns=$1
  redis_port=$3
  bench_env "$ns" "$2" "${4:-}"
  pids=()
  crowd_cleanup
  trap crowd_cleanup EXIT
  private_redis "$redis_port" "$out"
  export SECKILL_REDIS_URL=redis://127.0.0.1:$redis_port
  tokens_and_api
  on_sale 3 1
  THREADS=1 TOKENS="$out/tokens.txt" ITEM=3 MODE=sequential FIRST_USER=0 \
    wrk -t1 -c1 -d1s -s loadtest/wrk/flashbuy.lua "$api/api/flashbuy" >/dev/null
  sleep 1
}

# The processes in `pids`, the private Redis on $redis_port and the namespace $ns, gone.
crowd_cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  forget "$ns"
}
