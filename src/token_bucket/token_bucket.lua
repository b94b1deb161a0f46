-- The bucket's parameters and stored TAT (nil when none) at `now_us`: interval, now
-- (µs since the epoch in a[3]), tau (the burst's span) and tat.
local function token_bucket_load(key, a, now_us)
  local interval = a[1]
  return interval, now_us - a[3] * 1000000, interval * a[2], tonumber(redis.call('GET', key) or '')
end

-- Stores TAT `tat`, kept until the bucket is full again (and, with callers' clocks,
-- until a caller up to max(a full refill, 1 s) behind the writer also sees it full, so
-- that the key's expiry never hands such a caller a full bucket early).
local function token_bucket_store(key, tat, now, tau)
  local ttl = math.max(1, math.ceil((tat - now) / 1000))
  if caller_time then
    ttl = ttl + math.max(math.ceil(tau / 1000), 1000)
  end
  redis.call('SET', key, string.format('%.4f', tat), 'PX', string.format('%d', ttl))
end

-- Token bucket as GCRA, as an algorithm of the engine (src/backend/engine.lua), with
-- a = {emission interval (µs per token, fractional allowed), burst, epoch (whole seconds
-- since the Unix epoch)}: token_bucket_state(key, a, now_us) reads the key once,
-- token_bucket_step(s, cost, write) decides a check on that state (with `write`, moving
-- it as spending does; nothing goes to Redis), token_bucket_save(key, s) writes what the
-- steps changed, once. `key` holds the bucket's theoretical arrival time (TAT), in
-- microseconds since the epoch (close to now, so that doubles keep sub-microsecond
-- precision). A full bucket has TAT <= now; each token moves TAT one interval into the
-- future; a cost fits while TAT stays within burst intervals of now.
-- A step returns {admitted (1/0), tokens left, µs until admissible (0 when admitted),
-- µs until the bucket is full}. A TAT below now is never written, so no clock step and
-- no caller's clock refills a bucket beyond the time elapsed. A TAT more than tau ahead
-- only happens after the server clock stepped back, or for a caller whose clock is
-- behind: it is read as now + tau (an empty bucket), and after a step of the server's
-- clock a writing step writes it back so, so such a step blocks a key for at most the
-- time an empty bucket takes to refill, never for the length of the step.
local function token_bucket_state(key, a, now_us)
  local interval, now, tau, tat = token_bucket_load(key, a, now_us)
  local s = { interval = interval, now = now, tau = tau, tat = tat, stepped_back = false }
  if tat == nil or tat < now then
    s.tat = now
  elseif tat > now + tau then
    s.tat = now + tau
    s.stepped_back = true
  end
  return s
end

local function token_bucket_step(s, cost, write)
  local interval, now, tau, tat = s.interval, s.now, s.tau, s.tat
  local new_tat = tat + cost * interval
  local wait = new_tat - tau - now
  -- Tolerate float noise well below a microsecond.
  if wait > 0.001 then
    if write and s.stepped_back and not caller_time then
      -- The server's clock stepped back: the bucket is empty from now on, and refills
      -- at the rate from here (not after the length of the step). A caller's clock
      -- behind the others' never writes its view.
      s.empty = true
    end
    local available = math.floor((tau - (tat - now)) / interval + 1e-9)
    return {0, available, math.ceil(wait), math.ceil(tat - now)}
  end
  local full_in = new_tat - now
  if write then
    s.tat = new_tat
    s.spent = true
  end
  return {1, math.floor((tau - full_in) / interval + 1e-9), 0, math.ceil(full_in)}
end

local function token_bucket_save(key, s)
  if s.spent then
    token_bucket_store(key, s.tat, s.now, s.tau)
  elseif s.empty then
    redis.call('SET', key, string.format('%.4f', s.tat), 'PX',
      string.format('%d', math.max(1, math.ceil(s.tau / 1000))))
  end
end
-- token_bucket_refund(key, a, now_us, cost): puts `cost` tokens back (TAT moves back by
-- their intervals, never below now; a bucket full again is deleted).
local function token_bucket_refund(key, a, now_us, cost)
  local interval, now, tau, tat = token_bucket_load(key, a, now_us)
  if tat == nil or tat <= now then
    return
  end
  tat = math.max(now, tat - cost * interval)
  if tat - now <= 0.001 then
    redis.call('DEL', key)
  else
    token_bucket_store(key, tat, now, tau)
  end
end
-- token_bucket_reserve(key, a, now_us, cost, max_wait): takes `cost` tokens at the
-- earliest time they fit, if that is at most `max_wait` µs away: TAT moves on now and
-- the caller waits until then (one call per request, however many callers share the
-- bucket). Returns {admitted (1/0), tokens left (at the reserved time), µs to wait
-- (admitted: before using the tokens; refused: until they would fit), µs until full}.
local function token_bucket_reserve(key, a, now_us, cost, max_wait)
  local interval, now, tau, tat = token_bucket_load(key, a, now_us)
  if tat == nil or tat < now then
    tat = now
  end
  local new_tat = tat + cost * interval
  local wait = math.max(0, new_tat - tau - now)
  if wait > max_wait + 0.001 then
    local available = math.max(0, math.floor((tau - (tat - now)) / interval + 1e-9))
    return {0, available, math.ceil(wait), math.ceil(tat - now)}
  end
  token_bucket_store(key, new_tat, now, tau)
  local left = math.floor((tau - (new_tat - now - wait)) / interval + 1e-9)
  return {1, left, math.max(0, math.ceil(wait - 0.001)), math.ceil(new_tat - now)}
end
-- token_bucket_lease(key, a, now_us, cost, size): for a lease answered in process,
-- takes at least `cost` and at most `size` tokens, and never more than half of those
-- available beyond `cost` (so that a bucket near empty is shared exactly). Returns
-- {admitted (1/0), tokens left, tokens taken (admitted) or µs until `cost` fits
-- (refused), µs until full}.
local function token_bucket_lease(key, a, now_us, cost, size)
  local interval, now, tau, tat = token_bucket_load(key, a, now_us)
  if tat == nil or tat < now then
    tat = now
  elseif tat > now + tau then
    tat = now + tau
  end
  local available = math.floor((tau - (tat - now)) / interval + 1e-9)
  if available < cost then
    local wait = tat + cost * interval - tau - now
    return {0, math.max(0, available), math.ceil(wait), math.ceil(tat - now)}
  end
  local take = math.max(cost, math.min(size, cost + math.floor((available - cost) / 2)))
  local new_tat = tat + take * interval
  token_bucket_store(key, new_tat, now, tau)
  return {1, available - take, take, math.ceil(new_tat - now)}
end
