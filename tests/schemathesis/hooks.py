"""Schemathesis hooks for seckill: a fresh client clock, and purchases of the item on sale.

Generated values are kept where they are invalid (negative tests must still reach the
server's checks); valid ones are steered toward what gets past them, so that the deeper
code runs too.
"""

import hashlib
import hmac
import json
import os
import time
from datetime import datetime, timedelta, timezone

import schemathesis

ITEM = int(os.environ.get("SECKILL_ITEM", "1001"))
MOST_UNITS = 10_000
# What payment events are signed with (the server's SECKILL_PAYMENT_SECRET, its first).
PAYMENT_SECRET = os.environ.get("SECKILL_PAYMENT_SECRET", "").split(",")[0]


@schemathesis.hook
def map_headers(ctx, headers):
    # A well-formed X-Client-Time gets the real clock; a malformed one stays malformed.
    if headers and isinstance(headers.get("X-Client-Time"), str):
        if headers["X-Client-Time"].lstrip("-").isdigit():
            headers["X-Client-Time"] = str(int(time.time() * 1000))
    return headers


@schemathesis.hook
def before_call(ctx, case, kwargs):
    """A payment event whose generated signature header is a string is signed for real, as
    its provider would sign it, over the exact bytes sent: the checks behind the signature
    run too. One generated without the header (a negative case) stays unsigned: `401`."""
    if case.operation.path != "/api/payments/events" or not PAYMENT_SECRET:
        return
    if not isinstance((case.headers or {}).get("Seckill-Signature"), str):
        return
    if isinstance(case.body, (bytes, bytearray)):
        raw = bytes(case.body)
    else:
        try:
            raw = json.dumps(case.body).encode()
        except (TypeError, ValueError):
            return
    t = int(time.time())
    mac = hmac.new(PAYMENT_SECRET.encode(), f"{t}.".encode() + raw, hashlib.sha256)
    kwargs["data"] = raw
    case.headers["Seckill-Signature"] = f"t={t},v1={mac.hexdigest()}"
    case.headers["Content-Type"] = "application/json"


def _rfc3339(value):
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
        return True
    except (AttributeError, TypeError, ValueError):
        return False


def _sellable(item):
    """A valid item stays valid, only smaller and on sale now: most generated windows lie
    outside what MySQL stores (1970 to 2038) or end before they start, and a total of
    millions is a minute of Redis work that proves nothing a small one does not."""
    if not isinstance(item, dict):
        return
    if isinstance(item.get("total"), int) and item["total"] > MOST_UNITS:
        item["total"] = MOST_UNITS
    if _rfc3339(item.get("start_at")) and _rfc3339(item.get("end_at")):
        now = datetime.now(timezone.utc)
        item["start_at"] = (now - timedelta(minutes=1)).isoformat()
        item["end_at"] = (now + timedelta(days=1)).isoformat()
        _waves_within(item, now)
        if _rfc3339(item.get("draw_at")):
            item["draw_at"] = (now + timedelta(hours=1)).isoformat()


def _waves_within(item, now):
    """Well-formed waves moved into the window, a minute apart, one unit each, no more of
    them than units: a generated plan's times lie anywhere."""
    waves = item.get("release")
    if not isinstance(waves, list) or not all(isinstance(w, dict) for w in waves):
        return
    total = item.get("total")
    if isinstance(total, int) and total >= 0:
        del waves[total:]
    for n, wave in enumerate(waves):
        if _rfc3339(wave.get("at")):
            wave["at"] = (now + timedelta(minutes=1 + n)).isoformat()
        if isinstance(wave.get("units"), int) and wave["units"] >= 1:
            wave["units"] = 1


@schemathesis.hook
def map_body(ctx, body):
    if not isinstance(body, dict):
        return body
    path = ctx.operation.path
    if path == "/api/flashbuy" and isinstance(body.get("item_id"), int):
        if 1 <= body["item_id"] <= 9_999_999_999_999:
            body["item_id"] = ITEM
    elif path == "/admin/items" and isinstance(body.get("items"), list):
        for item in body["items"]:
            _sellable(item)
    else:
        _sellable(body)
    return body


# 503s the contract answers on purpose: an operator paused the item, opened a breaker or
# closed the shop (which the fuzzer's own admin calls do). Any other 5xx is a failure,
# except `unavailable` — a store that did not answer within the one-second budget (the
# test suite shares one MariaDB with every other test) — when the same request, made
# again after its Retry-After as the contract asks of clients, is answered.
DELIBERATE_503 = {"paused", "circuit_open", "shop_closed"}


def _code(response):
    try:
        return response.json().get("code")
    except Exception:  # not JSON: certainly not one of the contract's answers
        return None


@schemathesis.check
def only_deliberate_503s(ctx, response, case):
    if response.status_code < 500:
        return None
    code = _code(response)
    if response.status_code == 503 and code in DELIBERATE_503:
        return None
    if response.status_code == 503 and code == "unavailable":
        wait = (response.headers.get("retry-after") or ["1"])[0]
        time.sleep(min(float(wait) if wait.isdigit() else 1.0, 5.0))
        again = case.call()
        if again.status_code < 500 or (again.status_code == 503 and _code(again) in DELIBERATE_503):
            return None
        raise AssertionError(f"503 'unavailable', and again after Retry-After: {again.status_code} {_code(again)!r}")
    raise AssertionError(f"{response.status_code} {code!r}: not a refusal the contract makes on purpose")
