-- grab.lua: sell one unit of an item to one user, atomically.
--
-- KEYS[1] meta          HASH  `rules`: what this checks of the bucket, packed (lib/rules.lua);
--                             `lends`, read when it has no unit
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] buyer_orders  HASH  user_id -> the user's live orders (this user's shard; below)
-- KEYS[4] pending       HASH  order_sn -> order JSON (won, not yet in MySQL)
-- Without ARGV[5]:
-- KEYS[5] idempotency   STRING the order this user's Idempotency-Key bought; passed only
--                       when the buyer sent a key (its absence: no key)
-- With ARGV[5] (replicas asked for, as give_back.lua's keys):
-- KEYS[5] outbox        ZSET  order_sn -> won-at ms: where an answer naming orders the buyer
--                       holds claims those still pending (lib/repeats.lua)
-- KEYS[6] idempotency   STRING as KEYS[5] above, passed only with a key
-- ARGV[1] user_id
-- ARGV[2] order_sn      the number this order gets if the user wins
-- ARGV[3] order JSON    stored in `pending` for the publisher, the relay and order reads
--                       (the outbox gets the order when it is sent: src/outbox/mod.rs)
-- ARGV[4] the item's `per_user` as the caller's catalogue has it ('' or absent: unknown);
--         '' with ARGV[5], which gives it then
-- ARGV[5] the same `per_user`, passed only when replicas are asked for
--         (`SECKILL_REDIS_WAIT_REPLICAS` under the `refuse` policy, where a win they do not
--         confirm is given back): every answer naming orders the buyer holds claims those
--         still pending (its absence: each is named at once)
--
-- A buyer who already holds that many orders is answered first, before the meta and the
-- clock are read: it is the crowd's most frequent press that reaches Redis (a retry) and
-- costs one read this way. It is the truth whatever the sale's state; the window, the
-- pause and a reload were judged from memory just before. Should the caller's `per_user`
-- be older than a raise of it (a catalogue refreshes within a second), such a buyer hears
-- "duplicate" until then, and nothing is taken; a limit lowered meanwhile is caught below,
-- by the meta's own `per_user`. With ARGV[5] its orders still pending are claimed first
-- (lib/repeats.lua): the caller answers `409` once the replicas hold the claims, never
-- naming an order the press that won it may still give back. That costs such a retry one
-- `HGET` of `pending` per order named and, while one is pending, a `ZADD`; without
-- ARGV[5] the answer costs what it did (ARGV[4] is '' with it, so the checks that answer
-- without claiming never match it, and claiming costs them no test).
--
-- The sale's window is judged by Redis's own TIME, not by the caller's clock: a host whose
-- clock runs ahead or behind sells exactly when the others do.
--
-- A buyer record lists the user's live orders by place (lib/places.lua); a win takes the
-- first free one. A new order takes the first free place (its
-- `slot`, which MySQL's unique key on (item, live user, slot) backs).
--
-- Waves (`waves`, lib/waves.lua): a unit sells only while the list holds more than a wave
-- still to come holds back, by Redis's own TIME; while a wave is to come the answer is
-- never "sold out".
--
-- Returns one string, the outcome and its detail after a space (src/purchase/grab.rs):
--   "won" (place 0) | "won <slot>" | "repeat <order_sn>" (this key bought that order
--   before) | "claimed <order_sn>" (… and it is still pending: claimed now, it is the
--   buyer's once its replicas hold the claim; with ARGV[5] only) | "duplicate <order_sn>"
--   (per_user 1) | "limit_reached <sn sn …>" | "claimed_duplicate <order_sn>" |
--   "claimed_limit_reached <sn sn …>" (with ARGV[5] only: some of those orders are still
--   pending, claimed now; the answer stands once their replicas hold the claims) |
--   "sold_out" | "sold_out <lends>" (a bucket that lent units: lend.lua) |
--   "between_releases <next wave's ms>" | "paused" | "not_loaded" |
--   "reloading" (a warm-up is replacing the item's units: `fenced`) | "not_started" |
--   "ended";
--   an error, with nothing written, when the meta's window is not a number (or a claimed
--   order has no won-at time).
-- One string, not an array: Redis turns a table a script returns into a reply at three
-- times the cost of a string (it looks for `err`, `ok` and other fields first).
--
-- Every instruction here is paid on every press that reaches Redis, so the common case
-- takes the short way: `tonumber` is avoided where a string compares as well (it
-- converts twice; arithmetic on a string once), and a buyer with no record skips the
-- parse of one (loadtest/grab_anatomy.sh counts what each step costs).
--
-- A script never rolls back: every check happens before the first write (the LPOP).

-- The answer to a buyer whose live orders (`live`) reach `limit`, or nil.
local function at_limit(live, limit)
  if #live < limit then
    return nil
  end
  if limit == 1 then
    return 'duplicate ' .. live[1]
  end
  return 'limit_reached ' .. table.concat(live, ' ')
end

-- A buyer's key that bought before: its order, whatever else holds (claimed first when
-- replicas are asked for: lib/repeats.lua). Without a key and without ARGV[5] this is one
-- test, as it always was.
local key = KEYS[5]
if key then
  local outbox = nil
  if ARGV[5] then
    outbox, key = key, KEYS[6]
  end
  local bought = key and redis.call('GET', key)
  if bought then
    if outbox then
      return claim_repeat(KEYS[4], outbox, bought)
    end
    return 'repeat ' .. bought
  end
end

local held = redis.call('HGET', KEYS[3], ARGV[1])
if held then
  local known_limit = ARGV[4]
  -- One order, the common case: a record of one place is an order number (a record has
  -- no trailing free places and goes when it holds none).
  if known_limit == '1' and not string.find(held, ' ', 1, true) then
    return 'duplicate ' .. held
  end
  known_limit = tonumber(known_limit)
  if known_limit then
    local _, live = parse_places(held)
    local refused = at_limit(live, known_limit)
    if refused then
      return refused
    end
  elseif ARGV[5] then
    -- Replicas asked for: the same answer, once what it names is claimed.
    local _, live = parse_places(held)
    local refused = at_limit(live, tonumber(ARGV[5]) or 1)
    if refused then
      return claim_held(KEYS[4], KEYS[5], live, refused)
    end
  end
end

-- One field read, not eight (lib/rules.lua).
local state, start_ms, end_ms, per_user, waves
local rules = redis.call('HGET', KEYS[1], 'rules')
if rules then
  state, start_ms, end_ms, per_user, waves =
    string.match(rules, '^(%S+) (%S*) (%S*) (%S*) (.*)$')
  if not state then
    return redis.error_reply('the meta\'s rules are not as lib/rules.lua packs them: ' .. rules)
  end
else
  -- Not packed: nothing loaded, or a meta written only by servers before commit 519a305.
  state, start_ms, end_ms, per_user, waves = read_rules(KEYS[1])
end
-- not_loaded, reloading, paused, or ended: a draw's units are given by rank (award.lua),
-- never to the fastest.
if state ~= 'open' then
  return state
end
-- Arithmetic on a string converts it (an error when it is not a number: nothing written).
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
if now < start_ms + 0 then
  return 'not_started'
end
if now >= end_ms + 0 then
  return 'ended'
end

-- No record: no order held, nothing to parse.
local places = nil
if held then
  local live
  places, live = parse_places(held)
  local refused = at_limit(live, tonumber(per_user) or 1)
  if refused then
    if ARGV[5] then
      return claim_held(KEYS[4], KEYS[5], live, refused)
    end
    return refused
  end
end

-- A wave to come holds back what is left here (even one with no share here: a split
-- item's buyer may borrow from a bucket it reached).
local next_wave = held_back(waves, KEYS[2], now)
if next_wave then
  return 'between_releases ' .. next_wave
end

local token = redis.call('LPOP', KEYS[2])
if not token then
  -- With the loans this bucket made, if any (a split item's: lend.lua).
  local lends = redis.call('HGET', KEYS[1], 'lends')
  return lends and 'sold_out ' .. lends or 'sold_out'
end

local slot = record_win(KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], places)
if key then
  redis.call('SET', key, ARGV[2], 'PX', 86400000)
end
if slot == 0 then
  return 'won'
end
return 'won ' .. slot
