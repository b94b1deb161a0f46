-- The bucket's parameters and stored state at `now_us`: interval, now (µs since the
-- epoch in a[3]), tau (the burst's span), the stored TAT (nil when none), skew (µs; 0
-- when none), floor (nil when none) and whether the key is marked blocked. The value
-- is the TAT alone, or "TAT skew" or "TAT skew floor" (see token_bucket_state), or
-- marked (token_bucket_mark) "TAT skew floor b", where a '-' is a TAT or floor that
-- is none.
local function token_bucket_load(KEYS, k, a, now_us)
  local interval = a[1]
  local value = redis.call('GET', KEYS[k])
  local tat, skew, floor, marked = nil, 0, nil, false
  if value then
    tat = tonumber(value)
    if tat == nil then
      local w1, w2, w3, w4 = string.match(value, '^(%S+) ?(%S*) ?(%S*) ?(%S*)$')
      tat = tonumber(w1)
      skew = tonumber(w2) or 0
      floor = tonumber(w3)
      marked = w4 == 'b'
    end
  end
  return interval, now_us - a[3] * 1000000, interval * a[2], tat, skew, floor, marked
end

-- Blocked keys (src/backend/decide/block.rs): the lean check reads the bucket's key
-- alone, so while a key is blocked its bucket is marked, and a marked value is one the
-- lean check leaves to the steps (which read the block). token_bucket_mark(KEYS, k, ms)
-- marks the key for at least `ms` (a key that held nothing is marked too: the lean
-- check would take it for a full bucket); token_bucket_unmark(KEYS, k) takes the mark
-- off once the block has ended (a write the steps did takes it off too).
local function token_bucket_mark(KEYS, k, ms)
  local value = redis.call('GET', KEYS[k])
  if not value then
    redis.call('SET', KEYS[k], '- 0 - b', 'PX', string.format('%d', ms))
    return
  end
  local ttl = redis.call('PTTL', KEYS[k])
  if string.sub(value, -2) ~= ' b' then
    local w1, w2, w3 = string.match(value, '^(%S+) ?(%S*) ?(%S*)')
    if w2 == '' then
      w2 = '0'
    end
    if w3 == '' then
      w3 = '-'
    end
    redis.call('SET', KEYS[k], w1 .. ' ' .. w2 .. ' ' .. w3 .. ' b', 'PX',
      string.format('%d', math.max(ttl, ms)))
  elseif ttl < ms then
    redis.call('PEXPIRE', KEYS[k], string.format('%d', ms))
  end
end

local function token_bucket_unmark(KEYS, k)
  local value = redis.call('GET', KEYS[k])
  if not value or string.sub(value, -2) ~= ' b' then
    return
  end
  -- (The value as the steps would have written it: a bare TAT is one the lean check
  -- reads.)
  local tat, skew, floor = string.match(value, '^(%S+) (%S+) (%S+)')
  if tat == '-' then
    redis.call('DEL', KEYS[k])
  elseif floor ~= '-' then
    redis.call('SET', KEYS[k], tat .. ' ' .. skew .. ' ' .. floor, 'KEEPTTL')
  elseif skew ~= '0' then
    redis.call('SET', KEYS[k], tat .. ' ' .. skew, 'KEEPTTL')
  else
    redis.call('SET', KEYS[k], tat, 'KEEPTTL')
  end
end

-- Stores state `s` (its TAT in the key's time, its skew, and the key's time as its floor
-- when the TAT alone does not tell it: a reservation beyond tau; otherwise TAT - tau is
-- the floor, a lower bound of the time the key has seen: see the module docs' "Clocks"
-- for what that costs, and the lean check's bare TAT, which this keeps), kept until the bucket
-- is full again on the server's clock: the expiry is the TAT itself as a time of the
-- server's clock, so a key whose time runs ahead of the server's (a skew) outlives it
-- by the skew, and is still there when the clock comes back. With callers' clocks, also
-- until a caller up to max(a full refill, 1 s) behind the writer sees it full, so that
-- the key's expiry never hands such a caller a full bucket early.
local function token_bucket_store(KEYS, k, s)
  local ttl = math.max(1, math.ceil((s.tat - s.server_now) / 1000))
  if caller_time then
    ttl = ttl + math.max(math.ceil(s.tau / 1000), 1000)
  end
  local value
  if not caller_time and s.tat - s.tau - s.now > s.eps then
    value = string.format('%.4f %d %d', s.tat, s.skew, s.now)
  elseif s.skew > 0 then
    value = string.format('%.4f %d', s.tat, s.skew)
  else
    value = string.format('%.4f', s.tat)
  end
  redis.call('SET', KEYS[k], value, 'PX', string.format('%d', ttl))
end

-- Token bucket as GCRA, as an algorithm of the engine (src/backend/decide/engine.lua), with
-- a = {emission interval (µs per token, fractional allowed), burst, epoch (whole seconds
-- since the Unix epoch)}: token_bucket_state(KEYS, k, a, now_us) reads the key once,
-- token_bucket_step(s, cost, write) decides a check on that state (with `write`, moving
-- it as spending does; nothing goes to Redis), token_bucket_save(KEYS, k, s) writes what the
-- steps changed, once. `KEYS[k]` holds the bucket's theoretical arrival time (TAT), in
-- microseconds since the epoch (close to now, so that doubles keep sub-microsecond
-- precision). A full bucket has TAT <= now; each token moves TAT one interval into the
-- future; a cost fits while TAT stays within burst intervals of now.
-- A step returns {admitted (1/0), tokens left, µs until admissible (0 when admitted),
-- µs until the bucket is full}. A TAT below now is never written, so no clock step and
-- no caller's clock refills a bucket beyond the time elapsed.
-- Clock steps (server's clock): the key has its own time, the server's plus a skew
-- stored with the TAT (none normally). The key's time is at least its floor, the
-- earliest time its state proves the key has seen: TAT - tau (an empty bucket), or the
-- time stored with a reservation that took the TAT further. A server's time below the
-- floor means the server's clock stepped back: the key's time is then the later of
-- (server's time + stored skew) and the floor, and the new skew is stored, so the key's time runs on at the server's rate from there (a step back blocks
-- a key for at most one refill, never for the step) and the TAT stays in the key's
-- time: when the clock comes back, the bucket is as the key left it, never refilled by
-- the round trip. Once the TAT is within tau of the server's time again (the clock came
-- back, or caught up), the skew is dropped. A step back that stays above the floor is
-- not seen: the key's time follows it, by less than one refill.
-- A caller's clock behind the others' (caller_time) reads such a TAT as an empty
-- bucket (the steps and leases clamp it to now + tau), and writes nothing then.
local function token_bucket_state(KEYS, k, a, now_us)
  local interval, now, tau, tat, skew, floor, marked = token_bucket_load(KEYS, k, a, now_us)
  local s = { interval = interval, server_now = now, now = now, tau = tau, tat = tat,
    skew = 0, stored_skew = skew, eps = token_bucket_eps(now, tau), marked = marked }
  if tat ~= nil and not caller_time then
    floor = floor or tat - tau
    if now < floor then
      -- Whole µs, so that the key's time stays an integer as the server's is.
      s.skew = math.max(skew, token_bucket_us(floor - now, s.eps))
      s.now = now + s.skew
    end
  end
  if s.tat == nil or s.tat < s.now then
    s.tat = s.now
  end
  return s
end

local function token_bucket_step(s, cost, write)
  local interval, now, tau, eps = s.interval, s.now, s.tau, s.eps
  -- A TAT beyond now + tau is a reservation's (tokens promised ahead): it counts. Only
  -- a caller whose clock is behind reads it as an empty bucket.
  local tat = s.tat
  if caller_time then
    tat = math.min(tat, now + tau)
  end
  local new_tat = tat + cost * interval
  local wait = new_tat - tau - now
  if write and s.skew ~= s.stored_skew then
    -- The key's skew changed (a step back, or the clock came back): store it.
    s.rekey = true
  end
  -- Tolerate float noise well below a microsecond.
  if wait > eps then
    local available = math.max(0, token_bucket_tokens(tau - (tat - now), interval, eps))
    return {0, available, token_bucket_us(wait, eps), token_bucket_us(tat - now, eps)}
  end
  local full_in = new_tat - now
  if write then
    s.tat = new_tat
    s.spent = true
  end
  return {1, token_bucket_tokens(tau - full_in, interval, eps), 0,
    token_bucket_us(full_in, eps)}
end

local function token_bucket_save(KEYS, k, s)
  if s.spent or s.rekey then
    token_bucket_store(KEYS, k, s)
  end
end
-- token_bucket_charge(s, cost): spends `cost` tokens on state `s` whatever the bucket
-- holds (a settlement's extra cost): a TAT taken beyond now + tau is debt, which the
-- next steps refuse until the time has paid it off (their wait says when). Never
-- clamped to a caller's clock: a charge only moves the TAT on.
local function token_bucket_charge(s, cost)
  s.tat = s.tat + cost * s.interval
  s.spent = true
  if s.skew ~= s.stored_skew then
    s.rekey = true
  end
end
-- token_bucket_refund(KEYS, k, a, now_us, cost): puts `cost` tokens back (TAT moves back by
-- their intervals, never below the key's time; a bucket full again is deleted).
local function token_bucket_refund(KEYS, k, a, now_us, cost)
  local s = token_bucket_state(KEYS, k, a, now_us)
  if s.tat <= s.now then
    return
  end
  s.tat = math.max(s.now, s.tat - cost * s.interval)
  if s.tat - s.now <= s.eps then
    redis.call('DEL', KEYS[k])
  else
    token_bucket_store(KEYS, k, s)
  end
end
-- token_bucket_reserve(KEYS, k, a, now_us, cost, max_wait): takes `cost` tokens at the
-- earliest time they fit, if that is at most `max_wait` µs away: TAT moves on now and
-- the caller waits until then (one call per request, however many callers share the
-- bucket). Returns {admitted (1/0), tokens left (at the reserved time), µs to wait
-- (admitted: before using the tokens; refused: until they would fit), µs until full}.
-- The key's time is token_bucket_state's.
local function token_bucket_reserve(KEYS, k, a, now_us, cost, max_wait)
  local s = token_bucket_state(KEYS, k, a, now_us)
  local interval, now, tau, tat, eps = s.interval, s.now, s.tau, s.tat, s.eps
  local new_tat = tat + cost * interval
  local wait = math.max(0, new_tat - tau - now)
  if wait > max_wait + eps then
    local available = math.max(0, token_bucket_tokens(tau - (tat - now), interval, eps))
    if s.skew ~= s.stored_skew then
      token_bucket_store(KEYS, k, s)
    end
    return {0, available, token_bucket_us(wait, eps), token_bucket_us(tat - now, eps)}
  end
  s.tat = new_tat
  token_bucket_store(KEYS, k, s)
  local left = token_bucket_tokens(tau - (new_tat - now - wait), interval, eps)
  return {1, left, math.max(0, token_bucket_us(wait, eps)), token_bucket_us(new_tat - now, eps)}
end
-- token_bucket_lease(KEYS, k, a, now_us, cost, size): for a lease answered in process,
-- takes at least `cost` and at most `size` tokens, and never more than half of those
-- available beyond `cost` (so that a bucket near empty is shared exactly). Returns
-- {admitted (1/0), tokens left, tokens taken (admitted) or µs until `cost` fits
-- (refused), µs until full}. The key's time is token_bucket_state's.
local function token_bucket_lease(KEYS, k, a, now_us, cost, size)
  local s = token_bucket_state(KEYS, k, a, now_us)
  local interval, now, tau, eps = s.interval, s.now, s.tau, s.eps
  local tat = s.tat
  if caller_time then
    tat = math.min(tat, now + tau)
  end
  local available = token_bucket_tokens(tau - (tat - now), interval, eps)
  if available < cost then
    if s.skew ~= s.stored_skew then
      token_bucket_store(KEYS, k, s)
    end
    local wait = tat + cost * interval - tau - now
    return {0, math.max(0, available), token_bucket_us(wait, eps), token_bucket_us(tat - now, eps)}
  end
  local take = math.max(cost, math.min(size, cost + math.floor((available - cost) / 2)))
  s.tat = tat + take * interval
  token_bucket_store(KEYS, k, s)
  return {1, available - take, take, token_bucket_us(s.tat - now, eps)}
end
