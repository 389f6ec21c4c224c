-- release.lua: give the units of ended orders back to an item's sale, idempotently.
--
-- KEYS[1] meta          HASH  fenced
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] ending        ZSET  order_sn -> ms: cancels begun, their units not yet back
-- then, per order i (1-based): KEYS[3 + i] buyer_orders (HASH of the user's shard)
-- ARGV[2i - 1] user_id, ARGV[2i] order_sn   of order i
--
-- An order's unit comes back only while the user's buyer record still names that very
-- order (in one of its places, see grab.lua): a second call, or a call after the user
-- bought again, changes nothing. The unit
-- goes back as a token named after the order that returned it. Either way the order's
-- cancel is finished, so it leaves `ending`.
--
-- While a warm-up replaces the item's units (`fenced`) nothing is returned and `ending`
-- keeps every record: the warm-up counts holders once, and the scheduler's cut-off pass
-- returns these units after it (to the buyer records it rebuilt).
--
-- Returns the order numbers whose unit came back.

if redis.call('HEXISTS', KEYS[1], 'fenced') == 1 then
  return {}
end

local released = {}
for i = 1, #ARGV / 2 do
  local user, sn = ARGV[2 * i - 1], ARGV[2 * i]
  if free_place(KEYS[3 + i], user, sn) then
    redis.call('RPUSH', KEYS[2], 'r:' .. sn)
    released[#released + 1] = sn
  end
  redis.call('ZREM', KEYS[3], sn)
end
return released
