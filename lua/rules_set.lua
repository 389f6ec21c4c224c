-- rules_set.lua: write fields of a bucket's meta and pack what grab.lua checks of it
-- (lib/rules.lua) in the same step.
--
-- KEYS[1] meta   HASH
-- ARGV    field and value pairs to write; none: only pack again (the safety sweep), and
--         nothing at all for a meta that does not exist (a retired bucket stays gone)
--
-- Every write of a field grab.lua checks goes through here or through a script that packs
-- the same way (load_fresh.lua, swap.lua): a plain HSET would leave `rules` stale.
--
-- Returns nothing.

if #ARGV == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return
  end
else
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
pack_rules(KEYS[1])
