-- Token bucket in the engine, in two sections (see src/backend/decide/engine.rs, which
-- places every file's sections): `fast`, its part of the fast path
-- (src/backend/decide/fast.lua), and `general`, its steps for the general engine
-- (src/backend/decide/engine.lua), whose rules the fast path follows.
--## fast
-- Token bucket: the fast path (see src/backend/decide/fast.lua) and the float rules it shares
-- with the general steps (src/token_bucket/token_bucket.lua), placed before them.
-- The float noise (µs) of the times of a bucket whose times are about `magnitude` µs:
-- times are doubles of µs since the epoch in a[3] (2^45 µs in 2027, 2^47 by 2030), and
-- a span such as `new_tat - now` or `tau - (tat - now)` carries the rounding of the few
-- sums and products that made it (each at most half a unit in the last place of its
-- magnitude: magnitude * 2^-53), accumulated in the stored TAT over its writes, plus the
-- 0.00005 µs of the stored TAT's four decimals. Eight units in the last place
-- (magnitude * 2^-49: 0.06 µs in 2027) bound it; a fixed 1e-9 token (0.0007 µs at
-- 3 per 2 s) did not, and floor() then lost a token. The in-process host counts in
-- integer nanoseconds (its interval truncated to the nanosecond, its spans exact): a
-- span within the noise of a whole number of intervals is that number there, and so
-- here.
local function token_bucket_eps(magnitude, tau)
  return (math.abs(magnitude) + tau) * 2 ^ -49 + 0.0001
end

-- Whole tokens in `span` µs of a bucket (the part of tau not yet spent), within the
-- noise `eps` (token_bucket_eps).
local function token_bucket_tokens(span, interval, eps)
  return floor((span + eps) / interval)
end

-- `us` (a duration in µs) rounded up to the µs, within the noise `eps`.
local function token_bucket_us(us, eps)
  return ceil(us - eps)
end

-- The fast path (src/backend/decide/fast.lua): the common case of token_bucket_state and
-- token_bucket_step in the fewest commands and no tables, deciding exactly as they do.
-- token_bucket_try(value, interval, burst, epoch, cost, now_us, keep), on the key's value alone
-- (`value`: as the caller's GET of the key read it, or the TAT a check before this one
-- left in the same call), returns true, the tokens left, the µs until full and the new
-- TAT when the bucket admits the cost with the key's time the server's (no skew, no step
-- back, no block: a blocked key's value is marked, see token_bucket_mark) and, with
-- `keep` (a priority class's check), `keep` tokens more would fit too; else false,
-- and the steps decide (a refusal, a skew, a step back, a block). Nothing is written:
-- token_bucket_commit(KEYS, k, tat, now, tau) stores the new TAT as token_bucket_store does.
-- (The caller reads the key: for Redis a call of a function costs as much as ten
-- operations.)
local function token_bucket_try(value, interval, burst, epoch, cost, now_us, keep)
  local tat = nil
  if value then
    -- (A skew, a floor or a block's mark: a value of more than one word.)
    tat = to_number(value)
    if tat == nil then
      return false
    end
  end
  local now = now_us - epoch * 1000000
  local tau = interval * burst
  if tat ~= nil and not caller_time and now < tat - tau then
    return false
  end
  if tat == nil or tat < now then
    tat = now
  end
  -- (token_bucket_eps, token_bucket_tokens and token_bucket_us written out: for Redis
  -- a call of a function costs as much as ten operations.)
  local eps = ((now < 0 and -now or now) + tau) * 2 ^ -49 + 0.0001
  if tat > now + tau then
    tat = now + tau
  end
  local new_tat = tat + cost * interval
  if new_tat - tau - now > eps then
    return false
  end
  if keep and new_tat + keep * interval - tau - now > eps then
    return false
  end
  local full_in = new_tat - now
  return true, floor((tau - full_in + eps) / interval), ceil(full_in - eps), new_tat,
    now, tau
end

-- The TAT goes to Redis as digits that read back as the very double, alike in every
-- release (the steps write four decimals): as a number where Redis writes it exactly
-- (native_numbers()); else as text, its whole µs and seven decimals, exact when the TAT
-- is a multiple of 2^-7 µs (0.0078125), as every TAT from 2^45 µs past the epoch on is
-- (2027 with the default epoch), or else 17 significant digits; a whole TAT as its
-- digits alone. (Integer formats on the common path: libc's '%.17g' costs more.) The
-- expiry's text is kept for the next writes (at most 1000 of them, in the library of
-- Redis Functions; for one call by EVALSHA): a bucket's expiries repeat (1 ms for a
-- bucket kept near empty, at most its burst's ms), and string.format costs Redis 7.0
-- about 1 100 instructions a check.
local expiry_texts, expiry_count = {}, 0
local function token_bucket_commit(KEYS, k, tat, now, tau)
  local ttl = ceil((tat - now) / 1000)
  if ttl < 1 then
    ttl = 1
  end
  if caller_time then
    ttl = ttl + max(ceil(tau / 1000), 1000)
  end
  if numbers_native then
    redis.call('SET', KEYS[k], tat, 'PX', ttl)
    return
  end
  local whole = floor(tat)
  local text
  if tat == whole and tat >= 0 and tat < 9007199254740992 then
    -- (A whole TAT, as every one of a whole interval is: one conversion.)
    text = format('%d', tat)
  elseif tat * 128 == floor(tat * 128) and tat >= 0 and tat < 9007199254740992 then
    text = format('%d.%07d', whole, (tat - whole) * 10000000)
  else
    text = format('%.17g', tat)
  end
  local expiry = expiry_texts[ttl]
  if not expiry then
    expiry = format('%d', ttl)
    if expiry_count < 1000 then
      expiry_texts[ttl], expiry_count = expiry, expiry_count + 1
    end
  end
  redis.call('SET', KEYS[k], text, 'PX', expiry)
end

-- A settlement's write (token_bucket_settle): 1 the TAT (token_bucket_commit), 2 debt:
-- the TAT past a full burst with its floor, the key's time (token_bucket_store's
-- value), 3 a bucket full again, deleted.
local function token_bucket_write(KEYS, k, write, tat, now, tau)
  if write == 1 then
    token_bucket_commit(KEYS, k, tat, now, tau)
  elseif write == 2 then
    redis.call('SET', KEYS[k], format('%.4f %d %d', tat, 0, now), 'PX',
      format('%d', max(1, ceil((tat - now) / 1000))))
  else
    redis.call('DEL', KEYS[k])
  end
end

-- The fast settlement (src/backend/decide/fast.lua): token_bucket_charge (a `delta`
-- above 0) or token_bucket_refund (below 0), then the steps' answer to a cost of 0,
-- as the general engine runs a settlement, on the key's value alone (`value`: as the
-- caller's GET read it). Returns true, whether the bucket admits (false: it owes
-- tokens), the tokens left, the µs until admissible (0 when it admits) and the µs until
-- full, the bucket written as token_bucket_store would write it (a TAT past a full
-- burst, debt, with its floor); else false, nothing written, and the engine settles (a
-- skew, a step back, a floor, a block's mark: as token_bucket_try). With a table
-- `deferred` (a set's settlement), nothing is written: its write, TAT, time and tau go
-- there for token_bucket_write (no write: deferred[1] nil).
local function token_bucket_settle(KEYS, k, value, interval, burst, epoch, delta, now_us,
    deferred)
  local tat = nil
  if value then
    tat = to_number(value)
    if tat == nil then
      return false
    end
  end
  local now = now_us - epoch * 1000000
  local tau = interval * burst
  if tat ~= nil and not caller_time and now < tat - tau then
    return false
  end
  if tat == nil or tat < now then
    tat = now
  end
  local eps = ((now < 0 and -now or now) + tau) * 2 ^ -49 + 0.0001
  local write = nil
  if delta < 0 then
    -- Given back: never below the key's time; a bucket full again is deleted.
    if tat > now then
      tat = max(now, tat + delta * interval)
      write = tat - now <= eps and 3 or 1
    end
  else
    tat = tat + delta * interval
    write = (not caller_time and tat - tau - now > eps) and 2 or 1
  end
  if deferred then
    deferred[1], deferred[2], deferred[3], deferred[4] = write, tat, now, tau
  elseif write then
    token_bucket_write(KEYS, k, write, tat, now, tau)
  end
  -- (token_bucket_step's answer to a cost of 0, written out.)
  if caller_time and tat > now + tau then
    tat = now + tau
  end
  local left = floor((tau - (tat - now) + eps) / interval)
  local full = ceil(tat - now - eps)
  local wait = tat - tau - now
  if wait > eps then
    return true, false, max(0, left), ceil(wait - eps), full
  end
  return true, true, left, 0, full
end
--## general
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

-- Blocked keys (src/backend/decide/block.rs): the fast path reads the bucket's key
-- alone, so while a key is blocked its bucket is marked, and a marked value is one the
-- fast path leaves to the steps (which read the block). token_bucket_mark(KEYS, k, ms)
-- marks the key for at least `ms` (a key that held nothing is marked too: the fast
-- path would take it for a full bucket); token_bucket_unmark(KEYS, k) takes the mark
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
  -- (The value as the steps would have written it: a bare TAT is one the fast path
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
-- for what that costs, and the fast path's bare TAT, which this keeps), kept until the bucket
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
-- token_bucket_step(s, cost, write, keep) decides a check on that state (admitted when the
-- cost and `keep`, the tokens a priority class leaves to others, fit; with `write`, moving
-- it as spending the cost does; nothing goes to Redis), token_bucket_save(KEYS, k, s) writes what the
-- steps changed, once. `KEYS[k]` holds the bucket's theoretical arrival time (TAT), in
-- microseconds since the epoch (close to now, so that doubles keep sub-microsecond
-- precision). A full bucket has TAT <= now; each token moves TAT one interval into the
-- future; a cost fits while TAT stays within burst intervals of now.
-- A step returns {admitted (1/0), tokens left, µs until admissible (0 when admitted),
-- µs until the bucket is full}:
-- Reply: admitted, left, wait_us, full_us (src/backend/decide/protocol.rs: BucketReply)
-- A TAT below now is never written, so no clock step and no caller's clock refills a
-- bucket beyond the time elapsed.
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

local function token_bucket_step(s, cost, write, keep)
  local interval, now, tau, eps = s.interval, s.now, s.tau, s.eps
  -- A TAT beyond now + tau is a reservation's (tokens promised ahead): it counts. Only
  -- a caller whose clock is behind reads it as an empty bucket.
  local tat = s.tat
  if caller_time then
    tat = math.min(tat, now + tau)
  end
  local new_tat = tat + cost * interval
  local wait = new_tat + keep * interval - tau - now
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
