-- Fixed window, as an algorithm of the engine (src/backend/engine.lua), with a = {quota,
-- period (ms), UTC offset (ms) to align windows to, or nil for windows that start at the
-- first request}: period_state(key, a, now_us) reads the key once, period_step(s, cost,
-- write) decides a check on that state (with `write`, counting it; nothing goes to
-- Redis), period_save(key, s) writes what the steps changed, once. `key` holds the
-- count, with the window's end as its expiry (counted by the server).
-- A step returns {admitted (1/0), count, ms until the window ends}. A rejected request
-- is not counted. Time is used only to align a new window. A step of the server's clock
-- forward ends a window early, a step back keeps the count (a window never lasts more
-- than one period from now). Large numbers go to Redis through string.format('%d') so
-- that they are never written in exponent notation.
local function period_state(key, a, now_us)
  local quota, length, offset = a[1], a[2], a[3]
  local count = tonumber(redis.call('GET', key) or '0')
  local ttl = redis.call('PTTL', key)
  -- A window ends at its expiry: a PTTL of 0 is a key expiring this very millisecond
  -- (Redis still holds it), which is already the next window.
  local s = { quota = quota, length = length, count = count, ttl = ttl, added = 0 }
  s.fresh = count == 0 or ttl <= 0
  if not s.fresh and ttl > length then
    -- The server clock stepped back (Redis expiries are Unix times): keep the count, but
    -- end the window within one period, not one period plus the step.
    s.stepped = true
    s.ttl = length
  end
  if s.fresh then
    -- A new window, or a counter that lost its expiry (it must not live forever).
    s.count = 0
    if offset then
      local now = math.floor(now_us / 1000)
      s.deadline = now - ((now + offset) % length) + length
      s.ttl = s.deadline - now
    else
      s.ttl = length
    end
  end
  return s
end

local function period_step(s, cost, write)
  if write and s.stepped then
    s.shorten = true
  end
  if s.count + cost > s.quota then
    return {0, s.count, s.ttl}
  end
  if write then
    s.count = s.count + cost
    s.added = s.added + cost
    return {1, s.count, s.ttl}
  end
  return {1, s.count + cost, s.ttl}
end

local function period_save(key, s)
  if s.shorten then
    redis.call('PEXPIRE', key, string.format('%d', s.length))
  end
  if s.added == 0 then
    return
  end
  if not s.fresh then
    redis.call('INCRBY', key, s.added)
  elseif s.deadline and not caller_time then
    -- The server's own clock: end exactly on the edge.
    redis.call('SET', key, s.count, 'PXAT', string.format('%d', s.deadline))
  else
    -- The caller's clock is not the server's: the edge as a time to live.
    redis.call('SET', key, s.count, 'PX', string.format('%d', s.ttl))
  end
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
