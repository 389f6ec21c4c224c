-- wrk script: POST /api/flashbuy as many different users.
--
--   seckill token --user 1 --count 100000 > tokens.txt
--   TOKENS=tokens.txt ITEM=1001 wrk -t2 -c64 -d10s -s loadtest/wrk/flashbuy.lua \
--     http://127.0.0.1:8080/api/flashbuy
--
-- Environment:
--   TOKENS   file with one user JWT per line (required unless BARE_USERS is set)
--   ITEM     item id (default 1)
--   MODE     random: each request picks a random user (wins, then duplicates)
--            sequential: users in order, each once per lap (every request a new buyer)
--   BARE_USERS=N  for loadtest/bare.rs: send X-User (1..N) instead of a token
--   THREADS  wrk's -t, for sequential mode (default 2)
--   FIRST_USER  sequential mode starts after this many users (default 0)

local tokens = {}
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  item = os.getenv("ITEM") or "1"
  mode = os.getenv("MODE") or "random"
  stride = tonumber(os.getenv("THREADS") or "2")
  bare_users = tonumber(os.getenv("BARE_USERS") or "0")
  if bare_users == 0 then
    local path = os.getenv("TOKENS") or error("set TOKENS to a file of user tokens")
    for line in io.lines(path) do
      if #line > 0 then tokens[#tokens + 1] = line end
    end
    users = #tokens
  else
    users = bare_users
  end
  body = '{"item_id":' .. item .. '}'
  next_user = tonumber(os.getenv("FIRST_USER") or "0") + tid
  math.randomseed(os.time() * 1000 + tid)
end

function request()
  local user
  if mode == "sequential" then
    user = next_user % users + 1
    next_user = next_user + stride
  else
    user = math.random(users)
  end
  local headers = {
    ["Content-Type"] = "application/json",
    -- wrk's Lua has a clock in seconds: within the server's 5 s skew tolerance.
    ["X-Client-Time"] = string.format("%d", os.time() * 1000),
  }
  if bare_users > 0 then
    headers["X-User"] = tostring(user)
  else
    headers["Authorization"] = "Bearer " .. tokens[user]
  end
  return wrk.format("POST", nil, headers, body)
end
