-- bought.lua: the order a buyer's `Idempotency-Key` bought, for a press the catalogue in
-- memory refused (src/purchase/sell.rs, `bought_with`), with replicas asked for: grab.lua's
-- first step alone, the order claimed as there (lib/repeats.lua). Without replicas a `GET`
-- of the key says as much.
--
-- KEYS[1] idempotency  STRING the order this user's key bought
-- KEYS[2] pending      HASH   order_sn -> order JSON (won, not yet in MySQL)
-- KEYS[3] outbox       ZSET   order_sn -> won-at ms, negative once claimed
--
-- Returns nil (the key bought nothing), 'repeat <order_sn>' (in MySQL) or 'claimed
-- <order_sn>' (pending, claimed now); an error, with nothing written, when the pending
-- order has no won-at time.

local bought = redis.call('GET', KEYS[1])
if not bought then
  return false
end
return claim_repeat(KEYS[2], KEYS[3], bought)
