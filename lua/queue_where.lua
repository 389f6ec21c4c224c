-- queue_where.lua: where one buyer stands in an item's waiting room (lib/queue_where.lua).
--
-- KEYS[1] line, KEYS[2] state, KEYS[3] passes, KEYS[4] used (as queue_join.lua)
-- ARGV[1] user_id
return queue_where(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], queue_now())
