-- revive.lua: take a unit again, as a purchase would, for an order cancelled by its
-- deadline whose payment came late (SECKILL_LATE_PAYMENT=honour: src/payments/apply.rs).
--
-- KEYS[1] meta          HASH  the bucket's packed `rules` (lib/rules.lua)
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] buyer_orders  HASH  user_id -> the user's live orders (lib/places.lua)
-- KEYS[4] ending        ZSET  order_sn -> ms: changes under way whose unit may go back
-- ARGV[1] user_id
-- ARGV[2] order_sn
--
-- The order is in MySQL, cancelled, and its row is locked by the caller's transaction
-- while this runs. The unit is taken only where a purchase could take it now: the bucket
-- loaded, neither paused nor being reloaded, the sale's window open (a draw's units go by
-- rank, never to a late payment), the buyer under their `per_user`, no wave holding the
-- units back.
--
-- The order's number goes into `ending` with the unit (timed by Redis): should the
-- caller die before MySQL says `paid`, the scheduler's cut-off sweep finds the order
-- still cancelled there and gives the unit back (src/orders/ending.rs). Once MySQL said
-- `paid`, the caller drops that record.
--
-- Returns one string:
--   "taken <slot> <ms>"  a unit taken, the order in place `slot`, recorded in `ending` at ms
--   "kept <slot> <ms>"   its place still named it (the cancel never gave its unit back):
--                        nothing taken, recorded in `ending` alike
--   "busy"               a cancel of it is still giving its unit back, or the sale is
--                        paused or being reloaded: ask again in a moment
--   "closed"             not loaded (or retired), a draw, or the window is over
--   "limit"              the buyer holds `per_user` live orders
--   "none"               no unit on sale here now

local state, _, end_ms, per_user, waves
local rules = redis.call('HGET', KEYS[1], 'rules')
if rules then
  state, _, end_ms, per_user, waves = string.match(rules, '^(%S+) (%S*) (%S*) (%S*) (.*)$')
end
if not state then
  state, _, end_ms, per_user, waves = read_rules(KEYS[1])
end
-- Paused: an operator holds the sale, perhaps to reload it (a warm-up reads who holds
-- units while this payment is not yet committed): the event waits, as a purchase does.
if state == 'reloading' or state == 'paused' then
  return 'busy'
end
if state == 'not_loaded' or state == 'ended' then
  return 'closed'
end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
if end_ms == '' or now >= tonumber(end_ms) then
  return 'closed'
end
if redis.call('ZSCORE', KEYS[4], ARGV[2]) then
  return 'busy'
end

local places, live = parse_places(redis.call('HGET', KEYS[3], ARGV[1]))
for i = 1, #places do
  if places[i] == ARGV[2] then
    redis.call('ZADD', KEYS[4], now, ARGV[2])
    return 'kept ' .. (i - 1) .. ' ' .. now
  end
end
if #live >= (tonumber(per_user) or 1) then
  return 'limit'
end
if held_back(waves, KEYS[2], now) then
  return 'none'
end
if not redis.call('LPOP', KEYS[2]) then
  return 'none'
end
local slot = take_place(KEYS[3], ARGV[1], ARGV[2], places)
redis.call('ZADD', KEYS[4], now, ARGV[2])
return 'taken ' .. slot .. ' ' .. now
