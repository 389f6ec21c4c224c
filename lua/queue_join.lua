-- queue_join.lua: a buyer takes a place in an item's waiting room, once.
--
-- KEYS[1] line    ZSET  user_id -> place: the draw's rank (< 2^48) for those who joined
--                       before start_ms, 2^48 + arrival number after
-- KEYS[2] state   HASH  the queue's counters (queue_step.lua)
-- KEYS[3] passes  ZSET  user_id -> pass expiry (ms)
-- KEYS[4] used    HASH  user_id -> wins bought with a pass
-- ARGV[1] user_id
-- ARGV[2] the user's rank (src/draw/rank.rs, keyed by the queue's seed)
-- ARGV[3] start_ms, ARGV[4] opens_ms (start_ms - opens_before_s), ARGV[5] end_ms
--
-- Times are Redis's own TIME, the clock admission (queue_step.lua) keeps too: the
-- pre-queue closes at start_ms exactly when admission may begin, whichever host asks.
-- And it closes for good once anyone was let in (the state's `cursor`), whatever the
-- clock says — a master promoted with a clock behind, a `start_at` moved later: admission
-- walks the line by place, so a place taken ahead of those let in would let someone in
-- twice and skip another. Arrivals queue in Redis's order. A place, once taken, is kept
-- (joining again answers the same place).
--
-- Returns { 0 } before opens_ms (not open), { 1 } from end_ms for a newcomer (ended),
-- else { 2 (joined now) | 3 (joined before), <queue_where>... }.
local now = queue_now()
local verdict = 3
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if now < tonumber(ARGV[4]) then
    return { 0 }
  end
  if now >= tonumber(ARGV[5]) then
    return { 1 }
  end
  local place
  local let_in = tonumber(redis.call('HGET', KEYS[2], 'cursor')) or 0
  if now < tonumber(ARGV[3]) and let_in == 0 then
    place = ARGV[2]
  else
    place = 281474976710656 + redis.call('HINCRBY', KEYS[2], 'seq', 1)
  end
  redis.call('ZADD', KEYS[1], place, ARGV[1])
  verdict = 2
end
local reply = queue_where(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], now)
table.insert(reply, 1, verdict)
return reply
