-- lib/rules.lua: prepended to grab.lua and to every script that writes what it checks of
-- a bucket's meta (src/lua.rs).
--
-- grab.lua checks eight meta fields: `loaded`, `fenced`, `paused`, `draw_ms`, `start_ms`,
-- `end_ms`, `per_user`, `waves`. Reading eight fields of a hash cost a win a fifth of its
-- Redis time (an HMGET of eight: ~19,800 instructions; an HGET of one: ~4,800), so every
-- writer of them also writes them packed into one field, `rules`:
--
--   "<state> <start_ms> <end_ms> <per_user> <waves>"
--
-- `state` is what the grab answers before it looks at the window: `open`, `not_loaded`,
-- `reloading` (fenced), `paused` or `ended` (a draw's item: its units go by rank), in that
-- order of precedence. `waves` goes last: it holds spaces. An absent field is empty.
--
-- Servers before this release write the fields alone; the safety sweep packs every
-- bucket it visits again (rules_set.lua with no fields), so a `rules` field one of them
-- left stale is right again within a trip round the items index.

-- The grab's view of a bucket's meta, from its eight fields.
local function read_rules(meta)
  local m = redis.call('HMGET', meta, 'loaded', 'fenced', 'paused', 'draw_ms', 'start_ms',
    'end_ms', 'per_user', 'waves')
  local state = 'open'
  if not m[1] then
    state = 'not_loaded'
  elseif m[2] then
    state = 'reloading'
  elseif m[3] == '1' then
    state = 'paused'
  elseif m[4] and m[4] ~= '' then
    state = 'ended'
  end
  return state, m[5] or '', m[6] or '', m[7] or '', m[8] or ''
end

-- Writes the meta's `rules` from its fields (only when it changed: a write replicates).
local function pack_rules(meta)
  local packed = table.concat({read_rules(meta)}, ' ')
  if redis.call('HGET', meta, 'rules') ~= packed then
    redis.call('HSET', meta, 'rules', packed)
  end
end
