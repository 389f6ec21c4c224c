// The storefront: one item, one buyer, one button. No framework: the page is small, and a
// sale day is no day to download one. The API it talks to is CONTRACT.md sections 3 and 5.
"use strict";

/** A click waits this long for a second one: a double click sends one request. */
const DEBOUNCE_MS = 300;
const ITEM_EVERY_MS = 1000;
const ORDER_EVERY_MS = 500;

const params = new URLSearchParams(location.search);
const itemId = Number(params.get("item") || 1001);
if (params.get("token")) localStorage.setItem("seckill.token", params.get("token"));
let token = localStorage.getItem("seckill.token");

const $ = (id) => document.getElementById(id);

/** What the server's codes mean, in the buyer's words. */
const WORDS = {
  sold_out: "Sold out — every unit has been taken.",
  between_releases: "Everything released so far is taken — more goes on sale at the next wave.",
  limit_reached: "You hold as many of these as one buyer may.",
  entered: "You are in the draw. Winners are drawn at the time shown above.",
  not_drawn: "Not drawn this time. If a winner gives their unit back, it may still come to you.",
  not_started: "The sale has not started yet.",
  ended: "The sale has ended.",
  rate_limited: "Too many tries. Wait a second, then press again.",
  paused: "The sale is paused for a moment. Please try again shortly.",
  circuit_open: "We are very busy right now. Please try again in a moment.",
  unavailable: "We are very busy right now. Please try again in a moment.",
  shop_closed: "The shop is closed right now.",
  unauthorized: "Please sign in again: your session has expired.",
  clock_skew: "Your device's clock is off. Please correct it and try again.",
  item_not_found: "This item does not exist.",
  queue_not_open: "The line for this sale is not open yet.",
  queue_required: "This sale is by turns: join the line first.",
  pass_expired: "Your turn passed without a purchase; the unit went to the next in line.",
  pass_used: "You bought what your turn allows.",
  pow_failed: "Joining the line failed its check. Please try again.",
  network: "No connection to the shop. Check your network and try again.",
};

let item = null; // the last answer of GET /api/items/{id}
let pressed = false; // a purchase is in flight, or won: the button stays off
let debounce = null;
let orderSn = null;
/** Live orders this buyer holds of the item (items with `per_user` > 1 may take more). */
let held = 0;
/** Said with the order when the purchase's own answer never arrived. */
let lostNote = "";
/** A sale with a waiting room: whether this buyer joined its line, and their pass once
 *  it is their turn. */
let queued = { joined: false, pass: null, expiresAt: 0 };

async function api(method, path, body, extra = {}) {
  const headers = { ...extra };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (path === "/api/flashbuy") headers["X-Client-Time"] = String(Date.now());
  try {
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let json;
    try {
      json = await response.json();
    } catch {
      json = { code: "bad_answer" };
    }
    return { ...json, http: response.status };
  } catch {
    return { http: 0, code: "network" };
  }
}

function say(text) {
  $("outcome").textContent = text;
}

function clock(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(Math.floor(s / 3600))}:${pad(Math.floor(s / 60) % 60)}:${pad(s % 60)}`;
}

/** Redraws the countdown and the button from the last item answer and the clock. */
function render() {
  if (!item) return;
  const now = Date.now();
  const start = Date.parse(item.start_at);
  const end = Date.parse(item.end_at);
  let line;
  let open = false;
  const soldOut = item.status === "sold_out" || (item.status === "active" && item.remaining === 0);
  const nextWave = item.next_release_at ? Date.parse(item.next_release_at) : null;
  const drawAt = item.draw_at ? Date.parse(item.draw_at) : null;
  $("buy").textContent = drawAt ? "Enter the draw" : "Buy now";
  if (item.queue && !queued.pass) {
    renderLine(now, start, end, soldOut);
    return;
  }
  if (drawAt && now >= start && now < drawAt) {
    line = `Entries close in ${clock(drawAt - now)}; winners are drawn then`;
    open = true;
  } else if (drawAt && now >= drawAt && now < end) line = "Entries are closed; winners are drawn";
  else if (soldOut) line = "Sold out";
  else if (item.status === "between_releases" && nextWave && now < nextWave)
    line = `More goes on sale in ${clock(nextWave - now)}`;
  else if (item.status === "ended" || now >= end) line = "The sale has ended";
  else if (item.status === "paused") line = "Paused";
  else if (now < start) line = `Starts in ${clock(start - now)}`;
  else {
    line = "On sale now";
    open = true;
  }
  $("countdown").textContent = line;
  $("buy").disabled = !open || pressed || !token;
}

/** A sale with a waiting room, before the buyer's turn: the button joins the line. */
function renderLine(now, start, end, soldOut) {
  const opens = start - item.queue.opens_before_s * 1000;
  let line;
  let open = false;
  if (now >= end) line = "The sale has ended";
  else if (now < opens) line = `The line opens in ${clock(opens - now)}`;
  else if (queued.joined) line = now < start ? `Starts in ${clock(start - now)}` : "On sale now, by turns";
  else {
    // Sold out or not: the line is also the waitlist for units that come back.
    line = now < start ? `Starts in ${clock(start - now)}; join the line now` : "On sale now, by turns";
    if (soldOut && now >= start) line = "Sold out for now: join the line for units that come back";
    open = true;
  }
  $("countdown").textContent = line;
  $("buy").textContent = queued.joined ? "In line…" : "Join the line";
  $("buy").disabled = !open || queued.joined || !token;
}

/** The leading zero bits of a digest. */
function zeroBits(bytes) {
  let bits = 0;
  for (const byte of bytes) {
    if (byte === 0) {
      bits += 8;
      continue;
    }
    return bits + Math.clz32(byte) - 24;
  }
  return bits;
}

/** The proof-of-work a join may cost: a nonce whose SHA-256 with the challenge begins
 *  with `bits` zero bits (Web Crypto; a second or so at 16 bits). */
async function solve(challenge, bits) {
  const encoder = new TextEncoder();
  for (let nonce = 0; ; nonce++) {
    const digest = await crypto.subtle.digest("SHA-256", encoder.encode(`${challenge}:${nonce}`));
    if (zeroBits(new Uint8Array(digest)) >= bits) return String(nonce);
  }
}

async function joinLine() {
  $("buy").disabled = true;
  let body;
  if (item.queue.pow_bits > 0) {
    say("Checking your browser…");
    const given = await api("GET", `/api/items/${itemId}/queue/challenge`);
    if (given.http !== 200) {
      say(WORDS[given.code] || `Joining failed (${given.code}). Please try again.`);
      render();
      return;
    }
    body = { challenge: given.challenge, nonce: await solve(given.challenge, given.pow_bits) };
  }
  const answer = await api("POST", `/api/items/${itemId}/queue`, body);
  if (answer.http !== 200) {
    say(WORDS[answer.code] || `Joining failed (${answer.code}). Please try again.`);
    render();
    return;
  }
  queued.joined = true;
  render();
  showPlace(answer);
  followLine();
}

/** Shows where the buyer stands; answers whether their wait is over. */
function showPlace(place) {
  const line = $("queue");
  line.hidden = false;
  switch (place.state) {
    case "waiting": {
      let text = `You are number ${place.position} in line`;
      if (place.estimated_wait_s != null) text += ` — about ${clock(place.estimated_wait_s * 1000)} to go`;
      else if (place.units_held_until)
        text += ` — every unit is held by buyers who may not pay; known by ${new Date(place.units_held_until).toLocaleTimeString()}`;
      if (place.paused) text += " (the line is paused for a moment)";
      line.textContent = `${text}.`;
      say("");
      return false;
    }
    case "admitted":
      queued.pass = place.pass;
      queued.expiresAt = Date.parse(place.pass_expires_at);
      line.textContent = `It's your turn! Buy before ${new Date(queued.expiresAt).toLocaleTimeString()}.`;
      render();
      return true;
    case "sold_out":
      line.textContent = WORDS.sold_out;
      return false;
    case "expired":
      line.textContent = WORDS.pass_expired;
      return true;
    case "done":
      line.textContent = "You bought with your turn.";
      return true;
    default:
      return false;
  }
}

/** Follows the buyer's place as the server pushes it (one connection, Server-Sent Events
 *  read from a fetch, which can carry the token); a broken stream falls back to asking. */
async function followLine() {
  try {
    const response = await fetch(`/api/items/${itemId}/queue/me/events`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    if (response.ok && response.body) {
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let text = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += value;
        let end;
        while ((end = text.indexOf("\n\n")) >= 0) {
          const block = text.slice(0, end);
          text = text.slice(end + 2);
          const data = block.split("\n").find((l) => l.startsWith("data:"));
          if (data && showPlace(JSON.parse(data.slice(5)))) return;
        }
      }
    }
  } catch {
    // The stream broke: ask instead.
  }
  for (;;) {
    const place = await api("GET", `/api/items/${itemId}/queue/me`);
    if (place.http === 200 && showPlace(place)) return;
    await new Promise((resolve) => setTimeout(resolve, 2 * ITEM_EVERY_MS));
  }
}

async function refreshItem() {
  const answer = await api("GET", `/api/items/${itemId}`);
  if (answer.http === 200) {
    item = answer;
    $("name").textContent = item.name;
    $("remaining").textContent = item.remaining;
    $("total").textContent = item.total;
    showHeld();
  } else if (!item) {
    $("name").textContent = WORDS[answer.code] || "This item cannot be shown right now.";
  }
  render();
}

function onBuyClick() {
  if (item?.queue && !queued.pass) {
    if (!queued.joined) joinLine();
    return;
  }
  if (pressed) return;
  clearTimeout(debounce);
  debounce = setTimeout(buy, DEBOUNCE_MS);
}

/**
 * Whether a purchase's answer may have been lost after the server sold the unit: the
 * connection broke, a proxy answered for a server that died with the request in hand, or
 * the server could not finish its answer.
 */
const mayHaveWon = (answer) =>
  answer.http === 0 || answer.http === 502 || answer.http === 504 ||
  answer.code === "unavailable" || answer.code === "bad_answer";

/** "You hold 2 of 3", for an item a buyer may take more than one of. */
function showHeld() {
  const limit = item?.per_user || 1;
  $("held").hidden = limit <= 1 || held === 0;
  $("held").textContent = `You hold ${held} of ${limit}.`;
}

/** Counts the buyer's live orders of the item (`my-orders`). */
async function countHeld() {
  const mine = await api("GET", `/api/items/${itemId}/my-orders`);
  if (mine.http !== 200) return;
  held = mine.orders.filter((o) => o.status !== "cancelled").length;
  showHeld();
}

/** Looks for the buyer's order of this item; follows it and answers true if one holds a unit. */
async function findMyOrder() {
  const order = await api("GET", `/api/items/${itemId}/my-order`);
  if (order.http !== 200 || order.status === "cancelled") return false;
  pressed = true;
  render();
  follow(order.order_sn);
  return true;
}

/** After a win: a buyer who may hold more gets the button back. */
async function mayBuyMore() {
  await countHeld();
  if (held < (item?.per_user || 1)) {
    pressed = false;
    render();
  }
}

/** 128 random bits in hex (`crypto.randomUUID` needs HTTPS; this works on plain HTTP too). */
function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function buy() {
  pressed = true;
  render();
  say("Sending…");
  // One key per intended purchase: a retry of an answer lost on the way (the same key)
  // can never buy a second unit.
  const key = { "Idempotency-Key": newKey() };
  if (queued.pass) key["X-Queue-Pass"] = queued.pass;
  let answer = await api("POST", "/api/flashbuy", { item_id: itemId }, key);
  if (mayHaveWon(answer)) answer = await api("POST", "/api/flashbuy", { item_id: itemId }, key);
  if (answer.code === "entered") {
    say(WORDS.entered);
    followEntry();
  } else if (answer.http === 202) {
    say("You got one! Your order is being written…");
    follow(answer.order_sn);
    mayBuyMore();
  } else if (answer.code === "limit_reached") {
    say(WORDS.limit_reached);
    held = answer.order_sns.length;
    showHeld();
  } else if (answer.code === "duplicate") {
    say("You already hold one of these.");
    follow(answer.order_sn);
  } else if (mayHaveWon(answer) && (await findMyOrder())) {
    lostNote = " (The answer was lost on the way; this is your order.)";
    say(`You got one!${lostNote}`);
  } else {
    say(WORDS[answer.code] || `Something went wrong (${answer.code}). Please try again.`);
    if (answer.code === "sold_out" && item) item.remaining = 0;
    // Let the buyer press again, after the server's Retry-After when it gave one.
    const wait = answer.code === "rate_limited" ? 1000 : 0;
    setTimeout(() => {
      pressed = false;
      render();
    }, wait);
  }
  render();
}

/** After entering a draw: asks how the entry fared until it is decided. */
async function followEntry() {
  for (;;) {
    const entry = await api("GET", `/api/items/${itemId}/my-entry`);
    if (entry.http === 200 && entry.status === "won") {
      say("You were drawn! Pay to keep it.");
      follow(entry.order_sn);
      return;
    }
    if (entry.http === 200 && entry.status === "not_drawn") say(WORDS.not_drawn);
    await new Promise((resolve) => setTimeout(resolve, 2 * ITEM_EVERY_MS));
  }
}

/** Polls the order until it is in the database (unpaid), then offers to pay. */
async function follow(sn) {
  orderSn = sn;
  $("order").hidden = false;
  $("order-sn").textContent = sn;
  for (;;) {
    const order = await api("GET", `/api/orders/${encodeURIComponent(sn)}`);
    if (order.http === 200 && showStatus(order.status, order.pay_deadline)) return;
    await new Promise((resolve) => setTimeout(resolve, ORDER_EVERY_MS));
  }
}

/** Shows an order's status; answers whether it has settled (no more polling needed). */
function showStatus(state, deadline) {
  const status = $("order-status");
  const pay = $("pay");
  switch (state) {
    case "pending":
      status.textContent = "being written…";
      return false;
    case "unpaid":
      status.textContent = `awaiting payment (pay by ${new Date(deadline).toLocaleTimeString()})`;
      say(`You got one! Pay to keep it.${lostNote}`);
      pay.hidden = false;
      return true;
    case "paid":
      status.textContent = "paid";
      pay.hidden = true;
      return true;
    case "cancelled":
      status.textContent = "cancelled";
      pay.hidden = true;
      pressed = false;
      render();
      return true;
    case "refund_due":
      status.textContent = "paid too late: your money is being refunded";
      pay.hidden = true;
      return true;
    case "refunded":
      status.textContent = "refunded";
      pay.hidden = true;
      return true;
    default:
      return false;
  }
}

/** Checkout: the server says what to charge; the payment provider takes the money and
 *  tells the server (a signed event), and the page shows the order paid once it is. */
async function onPay() {
  $("pay").disabled = true;
  const answer = await api("POST", `/api/orders/${encodeURIComponent(orderSn)}/pay`);
  if (answer.http === 200 && answer.code === "checkout") {
    const amount = `${(answer.amount_cents / 100).toFixed(2)} ${answer.currency}`;
    say(`Pay ${amount} with your payment provider (reference ${answer.payment_ref}).`);
    $("order-status").textContent = "waiting for the payment";
    await settled(orderSn);
  } else if (answer.http === 200 || answer.code === "order_paid") {
    // A development server trusting its buyers (SECKILL_PAYMENTS=trust_buyer) paid it.
    showStatus("paid");
    say("Paid — thank you!");
  } else if (answer.code === "order_cancelled") {
    showStatus("cancelled");
    say("This order was cancelled: the time to pay ran out.");
  } else {
    say(WORDS[answer.code] || `Paying failed (${answer.code}). Please try again.`);
    $("pay").disabled = false;
  }
}

/** Polls the order until its payment is settled one way or another. */
async function settled(sn) {
  for (;;) {
    const order = await api("GET", `/api/orders/${encodeURIComponent(sn)}`);
    if (order.http === 200 && order.status !== "pending" && order.status !== "unpaid") {
      showStatus(order.status, order.pay_deadline);
      if (order.status === "paid") say("Paid — thank you!");
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, ORDER_EVERY_MS));
  }
}

function signIn(event) {
  event.preventDefault();
  token = $("token-input").value.trim();
  localStorage.setItem("seckill.token", token);
  $("signin").hidden = true;
  render();
}

$("buy").addEventListener("click", onBuyClick);
$("pay").addEventListener("click", onPay);
$("signin").addEventListener("submit", signIn);
$("signin").hidden = Boolean(token);
// Back after a lost answer or a reload: a unit already held is shown, not offered again.
if (token) {
  findMyOrder().then(async (found) => {
    if (found) {
      say("You already hold one of these.");
      return;
    }
    // A place in a waiting room, from an earlier visit: follow it.
    const place = await api("GET", `/api/items/${itemId}/queue/me`);
    if (place.http === 200) {
      queued.joined = true;
      if (!showPlace(place)) followLine();
      render();
      return;
    }
    // An entry in a draw, from an earlier visit: follow it.
    const entry = await api("GET", `/api/items/${itemId}/my-entry`);
    if (entry.http === 200) {
      pressed = true;
      render();
      say(WORDS.entered);
      followEntry();
    }
  });
}
refreshItem();
setInterval(refreshItem, ITEM_EVERY_MS);
setInterval(render, 250);
