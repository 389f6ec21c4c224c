// A k6 plan for seckill: a ramp of buyers, then everyone pressing at one instant.
//
//   seckill token --user 1 --count 5000 > tokens.txt
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e ITEM=1001 -e TOKENS=tokens.txt \
//          -e START_AT=2026-12-12T10:00:00+08:00 flashbuy.js
//
// Thresholds fail the run (k6 exits non-zero) when p99 is too slow or when the server
// answers anything a flash sale should not (5xx other than a deliberate 503, 400s, 401s).
// The defaults suit the 2-core machine docs/benchmarks.md measures on, where k6's virtual users
// share the cores with the server; on a real load host raise SPIKE_VUS (to 500 or more)
// and lower P99_SPIKE_MS / P99_RAMP_MS (loadtest/k6/README.md).
// k6 measures the answers; `seckill rehearse` also proves the outcome (no oversell, nothing
// lost) against Redis and MySQL — run it too before the day.
import http from "k6/http";
import { check } from "k6";
import { Counter, Rate } from "k6/metrics";
import { SharedArray } from "k6/data";
import exec from "k6/execution";

const BASE_URL = __ENV.BASE_URL || "http://127.0.0.1:8080";
const ITEM = Number(__ENV.ITEM || 1001);
// The spike's instant (RFC 3339); without it the spike follows the ramp.
const START_AT = __ENV.START_AT ? Date.parse(__ENV.START_AT) : null;
const SPIKE_PRESSES = Number(__ENV.SPIKE_PRESSES || 20000);
const SPIKE_VUS = Number(__ENV.SPIKE_VUS || 200);
// The ramp: arrivals grow to RAMP_RATE per second over RAMP_SECONDS, then hold.
const RAMP_RATE = Number(__ENV.RAMP_RATE || 300);
const RAMP_SECONDS = Number(__ENV.RAMP_SECONDS || 20);
const HOLD_SECONDS = Number(__ENV.HOLD_SECONDS || 15);
const P99_SPIKE_MS = Number(__ENV.P99_SPIKE_MS || 250);
const P99_RAMP_MS = Number(__ENV.P99_RAMP_MS || 100);

// One token per line, as `seckill token --count N` prints them; shared by every VU. A
// relative TOKENS path is taken from this script's folder (k6's rule): give an absolute
// one when running from elsewhere.
const tokens = new SharedArray("tokens", () =>
  open(__ENV.TOKENS || "tokens.txt")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line.length > 0),
);

// Answers a sale expects: a win, a loss, a repeat, a slow-down (and, for shaped sales, a
// buyer at their `per_user` limit or a wave still to come). Anything else is an error.
const EXPECTED = new Set([
  "queued",
  "sold_out",
  "duplicate",
  "limit_reached",
  "between_releases",
  "rate_limited",
  "not_started",
  "ended",
]);
const answers = new Counter("seckill_answers");
// So that k6's http_req_failed counts only answers outside a sale's normal ones: a "sold
// out" is the server working, not a failed request.
http.setResponseCallback(http.expectedStatuses(202, 403, 409, 410, 429));
const unexpected = new Rate("seckill_unexpected_answers");

function spikeStart() {
  if (START_AT === null) return `${RAMP_SECONDS + HOLD_SECONDS + 5}s`;
  const seconds = Math.max(0, Math.ceil((START_AT - Date.now()) / 1000));
  return `${seconds}s`;
}

export const options = {
  scenarios: {
    // Browsing crowd warming up: arrivals grow to RAMP_RATE per second, then hold.
    ramp: {
      executor: "ramping-arrival-rate",
      exec: "buy",
      startRate: Math.min(20, RAMP_RATE),
      timeUnit: "1s",
      preAllocatedVUs: Math.min(100, RAMP_RATE),
      maxVUs: Math.max(RAMP_RATE, 10),
      stages: [
        { target: RAMP_RATE, duration: `${RAMP_SECONDS}s` },
        { target: RAMP_RATE, duration: `${HOLD_SECONDS}s` },
      ],
    },
    // 10:00:00 — everyone presses at once, as fast as SPIKE_VUS connections allow.
    spike: {
      executor: "shared-iterations",
      exec: "buy",
      vus: SPIKE_VUS,
      iterations: SPIKE_PRESSES,
      startTime: spikeStart(),
      maxDuration: "60s",
    },
  },
  thresholds: {
    "http_req_duration{scenario:spike}": [`p(99)<${P99_SPIKE_MS}`],
    "http_req_duration{scenario:ramp}": [`p(99)<${P99_RAMP_MS}`],
    seckill_unexpected_answers: ["rate<0.001"],
    checks: ["rate>0.999"],
  },
};

export function buy() {
  const token = tokens[exec.scenario.iterationInTest % tokens.length];
  const response = http.post(`${BASE_URL}/api/flashbuy`, JSON.stringify({ item_id: ITEM }), {
    headers: {
      Authorization: `Bearer ${token}`,
      "Content-Type": "application/json",
      "X-Client-Time": String(Date.now()),
    },
    tags: { name: "POST /api/flashbuy" },
  });
  let code = "(not json)";
  try {
    code = response.json("code") || "(no code)";
  } catch (_) {
    // An answer that is not JSON is itself unexpected.
  }
  answers.add(1, { code, status: String(response.status) });
  unexpected.add(!EXPECTED.has(code));
  check(response, {
    "answered in the API's shape": (r) => r.headers["X-Request-Id"] !== undefined,
    "a win names its order": (r) => r.status !== 202 || typeof r.json("order_sn") === "string",
  });
}
