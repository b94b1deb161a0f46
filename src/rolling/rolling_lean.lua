-- Rolling window: the lean check (see src/backend/lean.lua), placed before the general
-- steps (src/rolling/rolling.lua), whose rules it follows.
-- The lean check (src/backend/lean.lua): the common case of rolling_state,
-- rolling_step and rolling_save in the fewest commands and tables, deciding exactly as
-- they do. rolling_try(key, limit, buckets, interval, cost, now_us) reads the key and
-- returns true, the sum after the cost, the ms until every counted unit has expired, the
-- current bucket and the dead fields (nil when none) when the window admits the cost
-- with the key's time the server's (no skew field, no bucket ahead of now); else false,
-- and the steps decide (a refusal, a skew, a step back). Nothing is written:
-- rolling_commit(key, dead, current, cost, buckets, interval) writes what rolling_save
-- would (with the server's clock, the key's expiry only when the current bucket starts:
-- it outlives every bucket then).
local function rolling_try(key, limit, buckets, interval, cost, now_us)
  local now = math.floor(now_us / 1000)
  local current = math.floor(now / interval)
  local oldest = current - buckets + 1
  local fields = redis.call('HGETALL', key)
  local sum = 0
  local dead = nil
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == 's' then
      return false
    end
    local index = tonumber(name)
    local count = tonumber(fields[i + 1])
    if index and count and count > 0 and count == math.floor(count)
        and index == math.floor(index) then
      if index > current then
        return false
      end
      if index >= oldest then
        sum = sum + count
      else
        dead = dead or {}
        dead[#dead + 1] = name
      end
    else
      dead = dead or {}
      dead[#dead + 1] = name
    end
  end
  if sum + cost > limit then
    return false
  end
  return true, sum + cost, (current + buckets) * interval - now, current, dead
end

local function rolling_commit(key, dead, current, cost, buckets, interval)
  if dead then
    for i = 1, #dead, 500 do
      redis.call('HDEL', key, unpack(dead, i, math.min(i + 499, #dead)))
    end
  end
  -- The key's expiry is set when its current bucket starts: a window and a bucket past
  -- then, so past the end of every bucket it holds. With the callers' clocks, at every
  -- admission: buckets follow the caller's clock and the expiry the server's, so one
  -- set at a bucket's start (by a caller ahead, or while the server's clock was behind)
  -- may end before the bucket does.
  if redis.call('HINCRBY', key, string.format('%d', current), cost) == cost or caller_time then
    redis.call('PEXPIRE', key, string.format('%d', (buckets + 1) * interval))
  end
end
