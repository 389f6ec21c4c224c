-- lib/places.lua: prepended to the scripts that sell a unit or take one back (src/lua.rs).
--
-- A buyer record (HASH field user_id in the shard's buyer_orders) lists the user's live
-- orders by place: order numbers separated by spaces, '-' for a free place, no trailing
-- free places; gone when none is held. With `per_user` 1 it is the one order number. A new
-- order takes the first free place (its `slot`, which MySQL's unique key on (item, live
-- user, slot) backs).

-- A record's places, and the order numbers among them.
local function parse_places(held)
  local places, live = {}, {}
  if held then
    for place in string.gmatch(held, '%S+') do
      places[#places + 1] = place
      if place ~= '-' then
        live[#live + 1] = place
      end
    end
  end
  return places, live
end

-- Records a won unit: `sn` takes the first free place of `places` (the user's record as
-- parse_places read it; nil for a user with no record), the order goes into `pending`.
-- The order JSON gets its place when not 0. Returns the place.
--
-- Nothing counts the sale: a bucket's units sold are its `total` less its listed units
-- (src/items/stock.rs), which the LPOP before this already changed. Servers up to commit
-- 5c24ba2 (2026-12-03) also counted sales in a meta field `sold`; during a rolling upgrade
-- they may still move it, and nothing of this release reads it.
--
-- Nor does it enter the order in the outbox: whoever sends it does, before sending (the
-- publisher, or the safety sweep for an order no publisher took: src/outbox/mod.rs), which
-- saved a purchase a tenth of its Redis time. Servers up to commit 668f7da entered it here.
-- Puts `sn` into the first free place of `places` (the user's record as parse_places read
-- it) and writes the record. Returns the place.
local function take_place(buyer_orders, user, sn, places)
  local slot = #places
  for i = 1, #places do
    if places[i] == '-' then
      slot = i - 1
      break
    end
  end
  places[slot + 1] = sn
  redis.call('HSET', buyer_orders, user, table.concat(places, ' '))
  return slot
end

local function record_win(buyer_orders, pending, user, sn, order, places)
  if not places then
    redis.call('HSET', buyer_orders, user, sn)
    redis.call('HSET', pending, sn, order)
    return 0
  end
  local slot = take_place(buyer_orders, user, sn, places)
  if slot > 0 then
    order = string.sub(order, 1, -2) .. ',"slot":' .. slot .. '}'
  end
  redis.call('HSET', pending, sn, order)
  return slot
end

-- Frees the place `sn` holds in `user`'s record (the record goes once they hold nothing).
-- Returns false, changing nothing, when no place holds `sn`.
--
-- Servers before 2026-12-03 also kept each buyer in a sorted set `buyers` that nothing
-- read; during a rolling upgrade they may still write it (and free it): an entry left
-- there is harmless and goes when the sale is retired.
local function free_place(buyer_orders, user, sn)
  local places, live = parse_places(redis.call('HGET', buyer_orders, user))
  local found = false
  for i = 1, #places do
    if places[i] == sn then
      places[i], found = '-', true
    end
  end
  if not found then
    return false
  end
  while places[#places] == '-' do
    places[#places] = nil
  end
  if #live == 1 then
    redis.call('HDEL', buyer_orders, user)
  else
    redis.call('HSET', buyer_orders, user, table.concat(places, ' '))
  end
  return true
end

