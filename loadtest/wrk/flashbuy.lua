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
--   BARE_USERS=N  for loadtest/bare.rs: send X-User (1..N), after the token of the same
--            line of TOKENS when that is set too (the same requests as seckill gets, which
--            the bare server reads no further than its X-User)
--   THREADS  wrk's -t, for sequential mode (default 2)
--   FIRST_USER  sequential mode starts after this many users (default 0)
--
-- wrk shares the machine with the server in loadtest/bench.sh, so each request is one
-- string concatenation of parts made once (wrk.format builds a table and formats every
-- header on every call: a third of a core at 100k requests/s).

local tokens = {}
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  local item = os.getenv("ITEM") or "1"
  mode = os.getenv("MODE") or "random"
  stride = tonumber(os.getenv("THREADS") or "2")
  local bare_users = tonumber(os.getenv("BARE_USERS") or "0")
  local path = os.getenv("TOKENS")
  if path then
    for line in io.lines(path) do
      if #line > 0 then tokens[#tokens + 1] = "Authorization: Bearer " .. line .. "\r\n" end
    end
  elseif bare_users == 0 then
    error("set TOKENS to a file of user tokens")
  end
  for user = 1, bare_users do tokens[user] = (tokens[user] or "") .. "X-User: " .. user .. "\r\n" end
  users = #tokens
  local body = '{"item_id":' .. item .. '}'
  head = "POST " .. wrk.path .. " HTTP/1.1\r\n"
    .. "Host: " .. wrk.host .. ":" .. wrk.port .. "\r\n"
    .. "Content-Type: application/json\r\n"
    .. "Content-Length: " .. #body .. "\r\n"
    .. "X-Client-Time: "
  tail = "\r\n" .. body
  next_user = tonumber(os.getenv("FIRST_USER") or "0") + tid
  math.randomseed(os.time() * 1000 + tid)
  second, clock = -1, ""
end

function request()
  local user
  if mode == "sequential" then
    user = next_user % users + 1
    next_user = next_user + stride
  else
    user = math.random(users)
  end
  local now = os.time()
  if now ~= second then
    -- wrk's Lua has a clock in seconds: within the server's 5 s skew tolerance.
    second, clock = now, now .. "000\r\n"
  end
  return head .. clock .. tokens[user] .. tail
end
