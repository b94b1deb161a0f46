-- Token bucket: the lean check (see src/backend/decide/lean.lua) and the float rules it shares
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

-- The lean check (src/backend/decide/lean.lua): the common case of token_bucket_state and
-- token_bucket_step in the fewest commands and no tables, deciding exactly as they do.
-- token_bucket_try(value, interval, burst, epoch, cost, now_us), on the key's value alone
-- (`value`: as the caller's GET of the key read it, or the TAT a check before this one
-- left in the same call), returns true, the tokens left, the µs until full and the new
-- TAT when the bucket admits the cost with the key's time the server's (no skew, no step
-- back, no block: a blocked key's value is marked, see token_bucket_mark); else false,
-- and the steps decide (a refusal, a skew, a step back, a block). Nothing is written:
-- token_bucket_commit(KEYS, k, tat, now, tau) stores the new TAT as token_bucket_store does.
-- (The caller reads the key: for Redis a call of a function costs as much as ten
-- operations.)
local function token_bucket_try(value, interval, burst, epoch, cost, now_us)
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

-- The lean settlement (src/backend/decide/lean.lua): token_bucket_charge (a `delta`
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
