-- lib/queue_where.lua: where one buyer stands in an item's waiting room (queue_join.lua,
-- queue_where.lua). All keys of one queue share its own hash tag.
--
-- Returns { in_line (0/1), index (0-based place in the line; -1), cursor (how many were
-- let in and shown: `shown`, which trails the step's `cursor` until the queue's replicas
-- hold the step — src/queue/admit.rs), pass_expires_ms (-1: no live pass), used (wins with a pass), sold_out (0/1),
-- known_by_ms (0: none), rate_milli (admissions per 1,000 s, as measured), now_ms,
-- paused (0/1), waiting (in line, not yet let in) }.
local function queue_where(line, state, passes, used, user, now)
  local index = redis.call('ZRANK', line, user)
  local st = redis.call('HMGET', state, 'shown', 'sold_out', 'known_by_ms', 'rate_milli',
    'paused')
  local cursor = tonumber(st[1]) or 0
  local waiting = redis.call('ZCARD', line) - cursor
  if waiting < 0 then
    waiting = 0
  end
  local expires = redis.call('ZSCORE', passes, user)
  return {
    index and 1 or 0,
    index or -1,
    cursor,
    expires and tonumber(expires) or -1,
    tonumber(redis.call('HGET', used, user)) or 0,
    st[2] == '1' and 1 or 0,
    tonumber(st[3]) or 0,
    tonumber(st[4]) or 0,
    now,
    st[5] == '1' and 1 or 0,
    waiting,
  }
end

local function queue_now()
  local time = redis.call('TIME')
  return time[1] * 1000 + math.floor(time[2] / 1000)
end
