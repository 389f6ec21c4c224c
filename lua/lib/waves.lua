-- lib/waves.lua: prepended to the scripts that sell or lend units (src/lua.rs).
--
-- A bucket's meta field `waves` lists "at_ms:held" pairs: until at_ms, `held` of the
-- bucket's listed units stay off sale (its share of that wave and every later one; see
-- src/items/waves.rs). Redis's own TIME decides, so a wave opens everywhere at once and
-- never early by some host's clock.
--
-- Units held back at `now` (ms), and the time of the wave they wait for: the first pair
-- still to come. 0 and nil when none is.
local function held_at(waves, now)
  for at, held in string.gmatch(waves, '(%d+):(%d+)') do
    if tonumber(at) > now then
      return tonumber(held), at
    end
  end
  return 0, nil
end

-- Returns the next wave's time (ms, as written) when the list `tokens` holds no unit
-- beyond what is held back, else nil. `now` (ms, Redis's TIME) when the caller has it.
local function held_back(waves, tokens, now)
  if not waves or waves == '' then
    return nil
  end
  if not now then
    local time = redis.call('TIME')
    now = time[1] * 1000 + math.floor(time[2] / 1000)
  end
  local held, at = held_at(waves, now)
  if at and redis.call('LLEN', tokens) <= held then
    return at
  end
  return nil
end
