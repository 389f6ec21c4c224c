-- lib/waves.lua: prepended to the scripts that sell or lend units (src/lua.rs).
--
-- A bucket's meta field `waves` lists "at_ms:held" pairs: until at_ms, `held` of the
-- bucket's listed units stay off sale (its share of that wave and every later one; see
-- src/items/waves.rs). Redis's own TIME decides, so a wave opens everywhere at once and
-- never early by some host's clock.
--
-- Returns the next wave's time (ms, as written) when the list `tokens` holds no unit
-- beyond what is held back, else nil.
local function held_back(waves, tokens)
  if not waves or waves == '' then
    return nil
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  for at, held in string.gmatch(waves, '(%d+):(%d+)') do
    if tonumber(at) > now then
      if redis.call('LLEN', tokens) <= tonumber(held) then
        return at
      end
      return nil
    end
  end
  return nil
end

