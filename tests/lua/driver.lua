-- Runs the crate's scripts outside Redis, on `lua5.1` and `lua5.4` (tests/dialect.rs),
-- to show that their arithmetic is the same in both dialects: numbers, not Redis.
--
--   lua5.x tests/lua/driver.lua CALLS NAME=SCRIPT...
--
-- CALLS holds one call per line: the script's NAME, the count of keys, then every key
-- and argument in hexadecimal, separated by spaces. Each call runs its script's text
-- whole, as EVALSHA does (KEYS and ARGV set as globals), on the scripts' caller-time
-- version: the time of a call is its last argument (µs since the Unix epoch), which is
-- also the clock of the keys' expiries here. The commands the scripts send are answered
-- from a table, with Redis's rules for the few the scripts use. Prints one line per
-- call: the reply (integers; tables in brackets; `nil`), or `error: ...`.
--
-- Stricter than Redis on purpose, since what Redis would quietly convert is what a Lua
-- 5.4 server converts its own way: every number sent in a command or a reply must be a
-- whole number, and on Lua 5.4 an integer (a float such as 3.0 is refused).

local unpack = table.unpack or unpack -- luacheck: ignore 113 143
local load_text = loadstring or load -- luacheck: ignore 113
local lua54 = math.type ~= nil

local function whole(v, what)
  if lua54 and math.type(v) ~= 'integer' then
    error(what .. ': a float, ' .. tostring(v), 0)
  end
  if v ~= math.floor(v) then
    error(what .. ': not a whole number, ' .. tostring(v), 0)
  end
  return v
end

-- The keys: { kind = 'string' | 'hash' | 'zset', v = value, at = expiry (ms) or nil }.
local db = {}
local now = 0

local function live(key)
  local e = db[key]
  if e and e.at and e.at < now then
    db[key] = nil
    return nil
  end
  return e
end

local function typed(key, kind)
  local e = live(key)
  if e and e.kind ~= kind then
    error({ err = 'WRONGTYPE Operation against a key holding the wrong kind of value' })
  end
  return e
end

local function integer(text)
  if type(text) ~= 'string' or not string.match(text, '^%-?%d+$') then
    error({ err = 'ERR value is not an integer or out of range' })
  end
  return tonumber(text)
end

local function number_text(n)
  return string.format('%d', n)
end

local commands = {}

function commands.GET(key)
  local e = typed(key, 'string')
  return e and e.v or false
end

function commands.MGET(...)
  local out = {}
  for i, key in ipairs({ ... }) do
    local e = live(key)
    out[i] = (e and e.kind == 'string') and e.v or false
  end
  return out
end

function commands.SET(key, value, ...)
  local options = { ... }
  local at = nil
  local i = 1
  while i <= #options do
    local option = string.upper(options[i])
    if option == 'PX' then
      local ms = integer(options[i + 1])
      if ms <= 0 then
        error({ err = "ERR invalid expire time in 'set' command" })
      end
      at = now + ms
      i = i + 2
    elseif option == 'KEEPTTL' then
      local e = live(key)
      at = e and e.at
      i = i + 1
    else
      error({ err = 'ERR syntax error (option ' .. option .. ' is not one the scripts may use)' })
    end
  end
  db[key] = { kind = 'string', v = value, at = at }
  return { ok = 'OK' }
end

function commands.DEL(...)
  local count = 0
  for _, key in ipairs({ ... }) do
    if live(key) then
      db[key] = nil
      count = count + 1
    end
  end
  return count
end

-- A change announced to the backends' subscriptions (src/backend/redis/changes.rs):
-- no key, nothing stored; the engine ignores the reply (the number of subscribers).
function commands.PUBLISH(channel, message) -- luacheck: ignore 212
  return 0
end

local function incrby(key, by)
  local e = typed(key, 'string')
  local value = (e and integer(e.v) or 0) + by
  db[key] = { kind = 'string', v = number_text(value), at = e and e.at }
  return value
end

function commands.INCRBY(key, by)
  return incrby(key, integer(by))
end

function commands.DECRBY(key, by)
  return incrby(key, -integer(by))
end

function commands.PTTL(key)
  local e = live(key)
  if not e then
    return -2
  elseif not e.at then
    return -1
  end
  return e.at - now
end

local function expire_at(key, at)
  local e = live(key)
  if not e then
    return 0
  end
  if at <= now then
    db[key] = nil
  else
    e.at = at
  end
  return 1
end

function commands.PEXPIRE(key, ms)
  return expire_at(key, now + integer(ms))
end

function commands.PEXPIREAT(key, at)
  return expire_at(key, integer(at))
end

-- A hash: v = { fields in insertion order, values by field }.
local function hash(key, create)
  local e = typed(key, 'hash')
  if not e and create then
    e = { kind = 'hash', v = { order = {}, values = {} } }
    db[key] = e
  end
  return e
end

local function hash_drop_empty(key, e)
  if #e.v.order == 0 then
    db[key] = nil
  end
end

function commands.HGETALL(key)
  local e = hash(key, false)
  local out = {}
  if e then
    for _, field in ipairs(e.v.order) do
      out[#out + 1] = field
      out[#out + 1] = e.v.values[field]
    end
  end
  return out
end

local function hash_set(e, field, value)
  if e.v.values[field] == nil then
    e.v.order[#e.v.order + 1] = field
    e.v.values[field] = value
    return 1
  end
  e.v.values[field] = value
  return 0
end

function commands.HSET(key, ...)
  local pairs_ = { ... }
  local e = hash(key, true)
  local added = 0
  for i = 1, #pairs_, 2 do
    added = added + hash_set(e, pairs_[i], pairs_[i + 1])
  end
  return added
end

function commands.HINCRBY(key, field, by)
  local e = hash(key, true)
  local value = integer(e.v.values[field] or '0') + integer(by)
  hash_set(e, field, number_text(value))
  return value
end

function commands.HDEL(key, ...)
  local e = hash(key, false)
  if not e then
    return 0
  end
  local removed = 0
  for _, field in ipairs({ ... }) do
    if e.v.values[field] ~= nil then
      e.v.values[field] = nil
      for i, name in ipairs(e.v.order) do
        if name == field then
          table.remove(e.v.order, i)
          break
        end
      end
      removed = removed + 1
    end
  end
  hash_drop_empty(key, e)
  return removed
end

-- A sorted set: v = { scores by member }.
local function zset(key, create)
  local e = typed(key, 'zset')
  if not e and create then
    e = { kind = 'zset', v = {} }
    db[key] = e
  end
  return e
end

local function zcard(e)
  local count = 0
  for _ in pairs(e.v) do
    count = count + 1
  end
  return count
end

function commands.ZADD(key, ...)
  local words = { ... }
  local xx = false
  if string.upper(words[1]) == 'XX' then
    xx = true
    table.remove(words, 1)
  end
  local e = zset(key, not xx)
  if not e then
    return 0
  end
  local added = 0
  for i = 1, #words, 2 do
    local score, member = tonumber(words[i]), words[i + 1]
    if e.v[member] == nil then
      if not xx then
        e.v[member] = score
        added = added + 1
      end
    else
      e.v[member] = score
    end
  end
  if zcard(e) == 0 then
    db[key] = nil
  end
  return added
end

function commands.ZCARD(key)
  local e = zset(key, false)
  return e and zcard(e) or 0
end

function commands.ZREM(key, ...)
  local e = zset(key, false)
  if not e then
    return 0
  end
  local removed = 0
  for _, member in ipairs({ ... }) do
    if e.v[member] ~= nil then
      e.v[member] = nil
      removed = removed + 1
    end
  end
  if zcard(e) == 0 then
    db[key] = nil
  end
  return removed
end

function commands.ZREMRANGEBYSCORE(key, min, max)
  local e = zset(key, false)
  if not e then
    return 0
  end
  local low = min == '-inf' and -math.huge or tonumber(min)
  local high = max == '+inf' and math.huge or tonumber(max)
  local removed = 0
  for member, score in pairs(e.v) do
    if score >= low and score <= high then
      e.v[member] = nil
      removed = removed + 1
    end
  end
  if zcard(e) == 0 then
    db[key] = nil
  end
  return removed
end

-- A command's argument as Redis reads it from a script: a string, or a whole number.
local function argument(v)
  if type(v) == 'string' then
    return v
  elseif type(v) == 'number' then
    return number_text(whole(v, 'a number in a command'))
  end
  error('an argument of type ' .. type(v), 0)
end

local function run(name, protected, ...)
  local command = commands[string.upper(name)]
  if not command then
    error('a command the scripts may not use: ' .. tostring(name), 0)
  end
  local args = { ... }
  for i = 1, select('#', ...) do
    args[i] = argument(args[i])
  end
  local ok, reply = pcall(command, unpack(args, 1, select('#', ...)))
  if ok then
    return reply
  elseif type(reply) == 'table' and protected then
    return reply
  elseif type(reply) == 'table' then
    error(reply.err, 0)
  end
  error(reply, 0)
end

redis = { -- luacheck: ignore 111
  call = function(name, ...)
    return run(name, false, ...)
  end,
  pcall = function(name, ...)
    return run(name, true, ...)
  end,
}

-- A script's reply as Redis would send it (a table ends at its first nil).
local function render(v)
  if type(v) == 'number' then
    return number_text(whole(v, 'a number in a reply'))
  elseif type(v) == 'string' then
    return '"' .. v .. '"'
  elseif v == nil or v == false then
    return 'nil'
  elseif v == true then
    return '1'
  elseif type(v) == 'table' then
    if v.ok then
      return '+' .. v.ok
    elseif v.err then
      return '-' .. v.err
    end
    local items = {}
    local i = 1
    while v[i] ~= nil do
      items[i] = render(v[i])
      i = i + 1
    end
    return '[' .. table.concat(items, ',') .. ']'
  end
  error('a reply of type ' .. type(v), 0)
end

local function read_all(path)
  local file = assert(io.open(path, 'rb'))
  local text = file:read('*a')
  file:close()
  return text
end

local function unhex(hex)
  return (string.gsub(hex, '%x%x', function(h)
    return string.char(tonumber(h, 16))
  end))
end

local scripts = {}
for i = 2, #arg do
  local name, path = string.match(arg[i], '^([^=]+)=(.+)$')
  scripts[name] = assert(load_text(read_all(path), '=' .. name))
end

for line in io.lines(arg[1]) do
  local words = {}
  for word in string.gmatch(line, '%S+') do
    words[#words + 1] = word
  end
  local script = assert(scripts[words[1]], 'no script ' .. words[1])
  local count = tonumber(words[2])
  local keys, argv = {}, {}
  for i = 3, #words do
    if i - 2 <= count then
      keys[#keys + 1] = unhex(words[i])
    else
      argv[#argv + 1] = unhex(words[i])
    end
  end
  -- The caller's time, the last argument: the keys' clock (ms).
  now = math.floor(tonumber(argv[#argv]) / 1000)
  KEYS, ARGV = keys, argv -- luacheck: ignore 111
  local ok, reply = pcall(script)
  if ok then
    ok, reply = pcall(render, reply)
  end
  if ok then
    print(reply)
  else
    print('error: ' .. tostring(reply))
  end
end
