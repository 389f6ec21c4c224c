// A k6 plan for a sale with a waiting room (`"queue"` on the item): every buyer joins the
// line, waits on their place's event stream until it is their turn, and buys with the pass.
//
//   seckill token --user 1 --count 2000 > tokens.txt
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e ITEM=1004 -e TOKENS=tokens.txt queued.js
//
// One virtual user is one buyer (BUYERS of them, each token once). The stream
// (`GET …/queue/me/events`) ends when the buyer is let in (or their pass ran out, or they
// bought); k6 reads an answer whole, so the request returns then. A buyer still waiting
// after WAIT_SECONDS (more buyers than units, and nobody paying: their units held by
// unpaid orders) is counted `still_waiting`, an answer a queued sale expects.
// With `pow_bits` > 0 each join first solves the challenge (k6's own SHA-256).
import http from "k6/http";
import crypto from "k6/crypto";
import { check } from "k6";
import { Counter, Rate } from "k6/metrics";
import { SharedArray } from "k6/data";
import exec from "k6/execution";

const BASE_URL = __ENV.BASE_URL || "http://127.0.0.1:8080";
const ITEM = Number(__ENV.ITEM || 1004);
const BUYERS = Number(__ENV.BUYERS || 1000);
const WAIT_SECONDS = Number(__ENV.WAIT_SECONDS || 60);

const tokens = new SharedArray("tokens", () =>
  open(__ENV.TOKENS || "tokens.txt")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line.length > 0),
);

// What a queued sale answers: joined, the turn's purchase won or refused as a sale
// refuses (sold out, a duplicate), a slow-down, or a buyer still waiting at the end.
const EXPECTED = new Set(["joined", "queued", "sold_out", "duplicate", "rate_limited", "still_waiting"]);
const answers = new Counter("seckill_answers");
const unexpected = new Rate("seckill_unexpected_answers");
const admittedIn = new Counter("seckill_queue_admitted");
http.setResponseCallback(http.expectedStatuses(200, 202, 409, 410, 429));

export const options = {
  scenarios: {
    line: {
      executor: "per-vu-iterations",
      vus: BUYERS,
      iterations: 1,
      maxDuration: `${WAIT_SECONDS + 60}s`,
    },
  },
  thresholds: {
    seckill_unexpected_answers: ["rate<0.001"],
    checks: ["rate>0.999"],
  },
};

function headers(token, more = {}) {
  return { Authorization: `Bearer ${token}`, "Content-Type": "application/json", ...more };
}

function count(code, status) {
  answers.add(1, { code, status: String(status) });
  unexpected.add(!EXPECTED.has(code));
}

function codeOf(response) {
  try {
    return response.json("code") || "(no code)";
  } catch (_) {
    return "(not json)";
  }
}

/** A nonce for which SHA-256("<challenge>:<nonce>") begins with `bits` zero bits. */
function solve(challenge, bits) {
  for (let nonce = 0; ; nonce++) {
    const hex = crypto.sha256(`${challenge}:${nonce}`, "hex");
    let zeros = 0;
    for (const digit of hex) {
      const value = parseInt(digit, 16);
      if (value === 0) {
        zeros += 4;
        continue;
      }
      zeros += Math.clz32(value) - 28;
      break;
    }
    if (zeros >= bits) return String(nonce);
  }
}

export default function () {
  const token = tokens[(exec.vu.idInTest - 1) % tokens.length];
  const queue = `${BASE_URL}/api/items/${ITEM}/queue`;
  let body = null;
  const given = http.get(`${queue}/challenge`, { headers: headers(token), tags: { name: "GET challenge" } });
  if (given.status === 200 && given.json("pow_bits") > 0) {
    const challenge = given.json("challenge");
    body = JSON.stringify({ challenge, nonce: solve(challenge, given.json("pow_bits")) });
  }
  const joined = http.post(queue, body, { headers: headers(token), tags: { name: "POST queue" } });
  count(codeOf(joined), joined.status);
  if (joined.status !== 200) return;

  // The stream ends at the buyer's turn; a timeout is a buyer still waiting.
  const stream = http.get(`${queue}/me/events`, {
    headers: headers(token),
    timeout: `${WAIT_SECONDS}s`,
    tags: { name: "GET queue/me/events" },
    responseCallback: http.expectedStatuses(200, 0),
  });
  if (stream.status === 0) {
    count("still_waiting", 0);
    return;
  }
  const places = stream.body
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => JSON.parse(line.slice(5)));
  const last = places[places.length - 1] || {};
  check(stream, { "the stream ends with a turn": () => last.state === "admitted" || last.state === "expired" || last.state === "done" });
  if (last.state !== "admitted") return;
  admittedIn.add(1);
  const bought = http.post(`${BASE_URL}/api/flashbuy`, JSON.stringify({ item_id: ITEM }), {
    headers: headers(token, { "X-Client-Time": String(Date.now()), "X-Queue-Pass": last.pass }),
    tags: { name: "POST /api/flashbuy" },
  });
  count(codeOf(bought), bought.status);
  check(bought, { "a win names its order": (r) => r.status !== 202 || typeof r.json("order_sn") === "string" });
}
