-- Fixed window, as a function of the engine (src/backend/engine.lua):
-- period(key, a, now_us, cost, write) with a = {quota, period (ms), UTC offset (ms) to
-- align windows to, or nil for windows that start at the first request}. `key` holds
-- the count, with the window's end as its expiry (counted by the server). `write` false
-- decides without changing anything (a set of limits, a peek).
-- Returns {admitted (1/0), count, ms until the window ends} and, when admitted, the
-- function that makes the change (a set calls it once every limit admitted). A rejected request is not
-- counted. Time is used only to align a new window. A step of the server's clock
-- forward ends a window early, a step back keeps the count (a window never lasts more
-- than one period from now). Large numbers go to Redis through string.format('%d') so
-- that they are never written in exponent notation.
local function period(key, a, now_us, cost, write)
  local quota, length, offset = a[1], a[2], a[3]
  local count = tonumber(redis.call('GET', key) or '0')
  local ttl = redis.call('PTTL', key)
  -- A window ends at its expiry: a PTTL of 0 is a key expiring this very millisecond
  -- (Redis still holds it), which is already the next window.
  local fresh = count == 0 or ttl <= 0
  local stepped = false
  if not fresh and ttl > length then
    stepped = true
    -- The server clock stepped back (Redis expiries are Unix times): keep the count, but
    -- end the window within one period, not one period plus the step.
    if write then
      redis.call('PEXPIRE', key, string.format('%d', length))
    end
    ttl = length
  end
  local deadline = nil
  if fresh then
    -- A new window, or a counter that lost its expiry (it must not live forever).
    count = 0
    if offset then
      local now = math.floor(now_us / 1000)
      deadline = now - ((now + offset) % length) + length
      ttl = deadline - now
    else
      ttl = length
    end
  end
  if count + cost > quota then
    return {0, count, ttl}
  end
  count = count + cost
  local function commit()
    if stepped and not write then
      redis.call('PEXPIRE', key, string.format('%d', length))
    end
    if not fresh then
      redis.call('INCRBY', key, cost)
    elseif deadline and not caller_time then
      -- The server's own clock: end exactly on the edge.
      redis.call('SET', key, count, 'PXAT', string.format('%d', deadline))
    else
      -- The caller's clock is not the server's: the edge as a time to live.
      redis.call('SET', key, count, 'PX', string.format('%d', ttl))
    end
  end
  if write then
    commit()
  end
  return {1, count, ttl}, commit
end
-- period_refund(key, a, now_us, cost): gives `cost` units back to the current window (a
-- window emptied by it is deleted: the next request starts a new one).
local function period_refund(key, a, now_us, cost)
  local count = tonumber(redis.call('GET', key) or '0')
  if count > 0 and redis.call('PTTL', key) > 0 then
    if count <= cost then
      redis.call('DEL', key)
    else
      redis.call('DECRBY', key, cost)
    end
  end
end
