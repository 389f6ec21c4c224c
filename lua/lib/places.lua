-- lib/places.lua: prepended to the scripts that take a won unit back (src/lua.rs).
--
-- A buyer record (HASH field user_id in the shard's buyer_orders) lists the user's live
-- orders by place: order numbers separated by spaces, '-' for a free place, no trailing
-- free places; gone when none is held (see grab.lua).
--
-- Frees the place `sn` holds in `user`'s record (and drops the user from `buyers` once
-- they hold nothing). Returns false, changing nothing, when no place holds `sn`.
local function free_place(buyers, buyer_orders, user, sn)
  local held = redis.call('HGET', buyer_orders, user)
  if not held then
    return false
  end
  local places, found, live = {}, false, 0
  for place in string.gmatch(held, '%S+') do
    if place == sn then
      place, found = '-', true
    elseif place ~= '-' then
      live = live + 1
    end
    places[#places + 1] = place
  end
  if not found then
    return false
  end
  while places[#places] == '-' do
    places[#places] = nil
  end
  if live == 0 then
    redis.call('HDEL', buyer_orders, user)
    redis.call('ZREM', buyers, user)
  else
    redis.call('HSET', buyer_orders, user, table.concat(places, ' '))
  end
  return true
end

