// The storefront in a real headless Chromium, against nginx in front of a real server.
// tests/it/storefront.rs sets the sale up and runs this with:
//   STOREFRONT_URL      nginx's address (http://127.0.0.1:PORT)
//   STOREFRONT_ITEMS    on-sale,sold-out,later,between-waves,three-per-buyer,draw,queued
//                       item ids (the queued one has a proof-of-work and one unit, its line
//                       already holding one buyer ahead)
//   STOREFRONT_TOKENS   seven user tokens, comma-separated
//   STOREFRONT_PAYMENT_SECRET  what the payment provider this test plays signs with
//   CHROMIUM            the browser (default /usr/bin/chromium, Debian's package)
//   STOREFRONT_SHOTS    optional folder for screenshots
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const need = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/it/storefront.rs sets it)`);
  return value;
};
const base = need("STOREFRONT_URL");
const [onSale, soldOut, later, betweenWaves, threePerBuyer, draw, queuedItem] =
  need("STOREFRONT_ITEMS").split(",");
const tokens = need("STOREFRONT_TOKENS").split(",");
const shots = process.env.STOREFRONT_SHOTS;
const paymentSecret = need("STOREFRONT_PAYMENT_SECRET");

/** The payment provider: takes the money (the test items cost 19.99 CNY) and tells the
 *  server, signed as the contract asks. */
async function providerPays(orderSn) {
  const body = JSON.stringify({
    event_id: `evt_storefront_${orderSn}`, type: "payment.succeeded", order_sn: orderSn,
    amount_cents: 1999, currency: "CNY", occurred_at: new Date().toISOString(),
    provider_ref: `ch_storefront_${orderSn}`,
  });
  const t = Math.floor(Date.now() / 1000);
  const v1 = createHmac("sha256", paymentSecret).update(`${t}.${body}`).digest("hex");
  const answer = await fetch(`${base}/api/payments/events`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "Seckill-Signature": `t=${t},v1=${v1}` },
    body,
  });
  assert.equal(answer.status, 200, await answer.text());
}

let browser;
before(async () => {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  if (shots) mkdirSync(shots, { recursive: true });
});
after(async () => browser?.close());

async function open(item, token) {
  const page = await browser.newPage({ viewport: { width: 640, height: 560 } });
  const purchases = [];
  page.on("request", (request) => {
    if (request.method() === "POST" && request.url().endsWith("/api/flashbuy")) {
      purchases.push(request.headers());
    }
  });
  await page.goto(`${base}/?item=${item}&token=${encodeURIComponent(token)}`);
  return { page, purchases };
}

async function text(page, selector, pattern, timeout = 10_000) {
  await page.waitForFunction(
    ([selector, source]) =>
      new RegExp(source).test(document.querySelector(selector)?.textContent ?? ""),
    [selector, pattern.source],
    { timeout },
  );
}

async function shot(page, name) {
  if (shots) await page.screenshot({ path: `${shots}/${name}.png` });
}

test("a click buys, and the order is paid once the provider says so", async () => {
  const { page, purchases } = await open(onSale, tokens[0]);
  await text(page, "#countdown", /On sale now/);
  await page.click("#buy");
  await text(page, "#outcome", /You got one/);
  await text(page, "#order-status", /awaiting payment/);
  await shot(page, "won");
  await page.click("#pay");
  await text(page, "#outcome", /Pay 19\.99 CNY with your payment provider/);
  await text(page, "#order-status", /waiting for the payment/);
  await providerPays(await page.textContent("#order-sn"));
  await text(page, "#outcome", /Paid/);
  await text(page, "#order-status", /^paid$/);
  await shot(page, "paid");
  assert.equal(purchases.length, 1);
  const sent = Number(purchases[0]["x-client-time"]);
  assert.ok(Math.abs(sent - Date.now()) < 60_000, `X-Client-Time ${sent} is a time in ms`);
  await page.close();
});

test("a double click sends one request", async () => {
  const { page, purchases } = await open(onSale, tokens[1]);
  await text(page, "#countdown", /On sale now/);
  await page.dblclick("#buy");
  await text(page, "#outcome", /You got one/);
  // Long enough for a second, undebounced request to have gone out.
  await page.waitForTimeout(1000);
  assert.equal(purchases.length, 1, "one purchase request for a double click");
  await page.close();
});

test("a purchase whose answer was lost finds its order, also after a reload", async () => {
  const { page, purchases } = await open(onSale, tokens[3]);
  // The purchase reaches the server and sells; the browser never hears the answer.
  await page.route("**/api/flashbuy", async (route) => {
    await route.fetch();
    await route.abort("connectionreset");
  });
  await text(page, "#countdown", /On sale now/);
  await page.click("#buy");
  await text(page, "#outcome", /answer was lost/);
  await text(page, "#order-status", /awaiting payment|being written/);
  const sn = await page.textContent("#order-sn");
  assert.match(sn, /^\d+-/);
  await shot(page, "lost-answer");
  // One retry, with the same Idempotency-Key: it cannot buy a second unit.
  assert.equal(purchases.length, 2, "a lost answer is retried once");
  assert.match(purchases[0]["idempotency-key"], /^[0-9a-f]{32}$/);
  assert.equal(purchases[1]["idempotency-key"], purchases[0]["idempotency-key"]);
  await page.close();

  const again = await open(onSale, tokens[3]);
  await text(again.page, "#order-sn", new RegExp(`^${sn}$`));
  await text(again.page, "#order-status", /awaiting payment/);
  assert.equal(await again.page.isDisabled("#buy"), true);
  assert.equal(again.purchases.length, 0);
  await again.page.close();
});

test("a sold-out item shows sold out", async () => {
  const { page, purchases } = await open(soldOut, tokens[2]);
  await text(page, "#countdown", /Sold out/);
  assert.equal(await page.isDisabled("#buy"), true);
  await shot(page, "sold-out");
  assert.equal(purchases.length, 0);
  await page.close();
});

test("a sale yet to start counts down and cannot be bought", async () => {
  const { page } = await open(later, tokens[2]);
  await text(page, "#countdown", /Starts in \d\d:\d\d:\d\d/);
  assert.equal(await page.isDisabled("#buy"), true);
  await shot(page, "countdown");
  await page.close();
});

test("between waves, a countdown to the next one", async () => {
  const { page, purchases } = await open(betweenWaves, tokens[2]);
  await text(page, "#countdown", /More goes on sale in \d\d:\d\d:\d\d/);
  assert.equal(await page.isDisabled("#buy"), true);
  await shot(page, "between-waves");
  assert.equal(purchases.length, 0);
  await page.close();
});

test("a buyer who may hold three sees how many they hold, and buys again", async () => {
  const { page, purchases } = await open(threePerBuyer, tokens[4]);
  await text(page, "#countdown", /On sale now/);
  await page.click("#buy");
  await text(page, "#held", /You hold 1 of 3/);
  await page.waitForFunction(() => !document.querySelector("#buy").disabled);
  await page.click("#buy");
  await text(page, "#held", /You hold 2 of 3/);
  await shot(page, "two-of-three");
  assert.equal(purchases.length, 2);
  assert.notEqual(purchases[0]["idempotency-key"], purchases[1]["idempotency-key"]);
  await page.close();
});

test("a draw takes an entry, and remembers it after a reload", async () => {
  const { page, purchases } = await open(draw, tokens[5]);
  await text(page, "#countdown", /Entries close in/);
  assert.equal(await page.textContent("#buy"), "Enter the draw");
  await page.click("#buy");
  await text(page, "#outcome", /You are in the draw/);
  await shot(page, "entered");
  assert.equal(purchases.length, 1);
  await page.close();

  const again = await open(draw, tokens[5]);
  await text(again.page, "#outcome", /You are in the draw/);
  assert.equal(await again.page.isDisabled("#buy"), true);
  assert.equal(again.purchases.length, 0);
  await again.page.close();
});

test("a waiting room: the proof-of-work solved, the place moving, the turn, the purchase", async () => {
  const { page, purchases } = await open(queuedItem, tokens[6]);
  // Its one unit is held by the buyer ahead: the line is a waitlist.
  await text(page, "#countdown", /join the line for units that come back/);
  assert.equal(await page.textContent("#buy"), "Join the line");
  const events = [];
  page.on("request", (request) => {
    if (request.url().includes("/queue/me/events")) events.push(request.url());
  });
  await page.click("#buy");
  // One buyer ahead holds the only unit's pass: this one waits, number 1 in line.
  await text(page, "#queue", /You are number 1 in line/);
  await text(page, "#buy", /In line…/);
  await shot(page, "in-line");
  assert.equal(purchases.length, 0);
  // The buyer ahead cancels (tests/it/storefront.rs, once it sees this one waiting): the
  // unit comes back, and it is this one's turn.
  await text(page, "#queue", /It's your turn/, 30_000);
  await shot(page, "your-turn");
  await page.click("#buy");
  await text(page, "#outcome", /You got one/);
  assert.equal(purchases.length, 1);
  assert.ok(purchases[0]["x-queue-pass"], "the purchase carries the pass");
  assert.equal(events.length, 1, "one stream, not a poll");
  await page.close();
});
