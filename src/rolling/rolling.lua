-- Rolling window of time buckets, as an algorithm of the engine (src/backend/engine.lua),
-- with a = {limit, buckets, interval (ms)}: rolling_state(key, a, now_us) reads the key
-- once, rolling_step(s, cost, write) decides a check on that state (with `write`,
-- counting it and marking the housekeeping; nothing goes to Redis), rolling_save(key, s)
-- writes what the steps changed, once. `key` is a hash with one field per bucket: the
-- absolute bucket index floor(now_ms / interval) in decimal, holding that bucket's
-- count. A decision that does not write leaves the housekeeping to one that does.
-- A bucket is live while its index is above current - buckets; bucket i stops counting at
-- (i + buckets) * interval ms. Dead fields are deleted by every save after a writing
-- step, so the hash holds at most `buckets` fields. Large numbers go to Redis through
-- string.format('%d') so that they are never written in exponent notation.
-- A step returns {admitted (1/0), sum of the live buckets after the check, ms until this
-- cost could be admitted (0 when admitted), ms until every counted unit has expired}.
-- A rejected request is not counted. With the server's time, every instance agrees on
-- bucket edges.
local function rolling_state(key, a, now_us)
  local limit, buckets, interval = a[1], a[2], a[3]
  local now = math.floor(now_us / 1000)
  local current = math.floor(now / interval)
  -- Clock steps: the key's own time never goes back. When the server clock has stepped
  -- back (a field newer than `current`), every bucket is moved back by the step, keeping
  -- its count and its age, as if no time had passed: a step back never frees a unit, and
  -- never blocks the key longer than the window. A step forward expires buckets early.
  -- With the callers' clocks, a field newer than `current` is written by a caller whose
  -- clock is ahead: this caller counts from that bucket instead (moving the buckets back
  -- would age them once per such caller, without bound), so no unit ever expires before
  -- the clock furthest ahead says so.
  local newest = nil
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local index = tonumber(fields[i])
    local count = tonumber(fields[i + 1])
    if index and count and count > 0 and count == math.floor(count)
        and index == math.floor(index) and (newest == nil or index > newest) then
      newest = index
    end
  end
  local shift = 0
  if newest and newest > current then
    if caller_time then
      current = newest
    else
      shift = newest - current
    end
  end
  local oldest = current - buckets + 1

  -- The live buckets (moved back by `shift`) by index, their indices in order, the
  -- fields to delete, the sum of the live counts. Every live index is at most `current`.
  local live = {}
  local indices = {}
  local dead = {}
  local sum = 0
  for i = 1, #fields, 2 do
    local index = tonumber(fields[i])
    local count = tonumber(fields[i + 1])
    if index and count and count > 0 and count == math.floor(count)
        and index == math.floor(index) and index - shift >= oldest then
      index = index - shift
      sum = sum + count
      if not live[index] then
        live[index] = 0
        indices[#indices + 1] = index
      end
      live[index] = live[index] + count
    else
      dead[#dead + 1] = fields[i]
    end
  end
  table.sort(indices)
  return { limit = limit, buckets = buckets, interval = interval, now = now,
    current = current, shift = shift, live = live, indices = indices, dead = dead,
    sum = sum, added = 0 }
end

local function rolling_step(s, cost, write)
  if write then
    s.housekeep = true
  end
  if s.sum + cost <= s.limit then
    if write then
      s.added = s.added + cost
      s.sum = s.sum + cost
      if not s.live[s.current] then
        s.live[s.current] = 0
        s.indices[#s.indices + 1] = s.current
      end
      s.live[s.current] = s.live[s.current] + cost
      return {1, s.sum, 0, (s.current + s.buckets) * s.interval - s.now}
    end
    return {1, s.sum + cost, 0, (s.current + s.buckets) * s.interval - s.now}
  end

  -- Rejected: the oldest buckets expire first; find the one whose expiry frees enough.
  local need = s.sum + cost - s.limit
  local freed = 0
  local retry = 0
  for _, index in ipairs(s.indices) do
    freed = freed + s.live[index]
    if freed >= need then
      retry = (index + s.buckets) * s.interval - s.now
      break
    end
  end
  local reset = 0
  if #s.indices > 0 then
    reset = (s.indices[#s.indices] + s.buckets) * s.interval - s.now
  end
  return {0, s.sum, retry, reset}
end

local function rolling_save(key, s)
  if not s.housekeep then
    return
  end
  local ttl = string.format('%d', (s.buckets + 1) * s.interval)
  if s.shift > 0 then
    -- The buckets moved back: rewrite them (the counted units included).
    redis.call('DEL', key)
    for _, index in ipairs(s.indices) do
      redis.call('HSET', key, string.format('%d', index), string.format('%d', s.live[index]))
    end
    if #s.indices > 0 then
      redis.call('PEXPIRE', key, ttl)
    end
    return
  end
  -- Delete the dead buckets in chunks (unpack() has a bounded stack).
  for i = 1, #s.dead, 500 do
    redis.call('HDEL', key, unpack(s.dead, i, math.min(i + 499, #s.dead)))
  end
  if s.added > 0 then
    redis.call('HINCRBY', key, string.format('%d', s.current), s.added)
    redis.call('PEXPIRE', key, ttl)
  end
end
-- rolling_refund(key, a, now_us, cost): takes `cost` units off the newest buckets first
-- (the units spent last), deleting the buckets it empties; expired buckets are left to
-- the next check.
local function rolling_refund(key, a, now_us, cost)
  local buckets, interval = a[2], a[3]
  local current = math.floor(math.floor(now_us / 1000) / interval)
  local fields = redis.call('HGETALL', key)
  local indices = {}
  local counts = {}
  for i = 1, #fields, 2 do
    local index = tonumber(fields[i])
    local count = tonumber(fields[i + 1])
    -- Live buckets, and buckets "in the future" (the clock stepped back): both count.
    if index and count and count > 0 and index > current - buckets then
      indices[#indices + 1] = index
      counts[index] = count
    end
  end
  table.sort(indices, function(x, y) return x > y end)
  for _, index in ipairs(indices) do
    if cost <= 0 then
      break
    end
    local take = math.min(cost, counts[index])
    cost = cost - take
    if take == counts[index] then
      redis.call('HDEL', key, string.format('%d', index))
    else
      redis.call('HINCRBY', key, string.format('%d', index), -take)
    end
  end
end
