-- Rolling window of time buckets, as a function of the engine (src/backend/engine.lua):
-- rolling(key, a, now_us, cost, write) with a = {limit, buckets, interval (ms)}. `key` is
-- a hash with one field per bucket: the absolute bucket index floor(now_ms / interval)
-- in decimal, holding that bucket's count. `write` false decides without changing
-- anything (and leaves the housekeeping to a call that writes).
-- A bucket is live while its index is above current - buckets; bucket i stops counting at
-- (i + buckets) * interval ms. Dead fields are deleted on every call that writes, so the
-- hash holds at most `buckets` fields. Large numbers go to Redis through
-- string.format('%d') so that they are never written in exponent notation.
-- Returns {admitted (1/0), sum of the live buckets after the call, ms until this cost
-- could be admitted (0 when admitted), ms until every counted unit has expired}.
-- A rejected request is not counted. With the server's time, every instance agrees on
-- bucket edges.
local function rolling(key, a, now_us, cost, write)
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
  -- Rewrites the moved buckets, or deletes the dead ones (whatever the outcome, when
  -- writing; with a deferred change, as part of it).
  local function housekeep()
    if shift > 0 then
      redis.call('DEL', key)
      for _, index in ipairs(indices) do
        redis.call('HSET', key, string.format('%d', index), string.format('%d', live[index]))
      end
      if #indices > 0 then
        redis.call('PEXPIRE', key, string.format('%d', (buckets + 1) * interval))
      end
    else
      -- Delete in chunks: unpack() has a bounded stack.
      for i = 1, #dead, 500 do
        redis.call('HDEL', key, unpack(dead, i, math.min(i + 499, #dead)))
      end
    end
  end
  if write then
    housekeep()
  end
  table.sort(indices)

  if sum + cost <= limit then
    local function commit()
      if not write then
        housekeep()
      end
      redis.call('HINCRBY', key, string.format('%d', current), cost)
      redis.call('PEXPIRE', key, string.format('%d', (buckets + 1) * interval))
    end
    if write then
      commit()
    end
    sum = sum + cost
    return {1, sum, 0, (current + buckets) * interval - now}, commit
  end

  -- Rejected: the oldest buckets expire first; find the one whose expiry frees enough.
  local need = sum + cost - limit
  local freed = 0
  local retry = 0
  for _, index in ipairs(indices) do
    freed = freed + live[index]
    if freed >= need then
      retry = (index + buckets) * interval - now
      break
    end
  end
  local reset = 0
  if #indices > 0 then
    reset = (indices[#indices] + buckets) * interval - now
  end
  return {0, sum, retry, reset}
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
