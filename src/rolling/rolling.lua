-- Rolling window in the engine, in two sections (see src/backend/decide/engine.rs, which
-- places every file's sections): `fast`, its part of the fast path
-- (src/backend/decide/fast.lua), and `general`, its steps for the general engine
-- (src/backend/decide/engine.lua), whose rules the fast path follows.
--## fast
-- Rolling window: the fast path (see src/backend/decide/fast.lua), placed before the general
-- steps (src/rolling/rolling.lua), whose rules it follows.
-- The fast path (src/backend/decide/fast.lua): the common case of rolling_state,
-- rolling_step and rolling_save in the fewest commands and tables, deciding exactly as
-- they do. rolling_try(KEYS, k, limit, buckets, interval, cost, now_us) reads the key and
-- returns true, the sum after the cost, the ms until every counted unit has expired, the
-- current bucket, the dead fields (nil when none) and whether the key's expiry already
-- covers the current bucket (`kept`, see rolling_commit) when the window admits the cost
-- with the key's time the server's (no skew field, no bucket ahead of now); else false,
-- and the steps decide (a refusal, a skew, a step back). Nothing is written:
-- rolling_commit(KEYS, k, dead, current, cost, cost_text, buckets, interval, kept)
-- writes what rolling_save would.
--
-- The key's expiry (with the server's clock): set when a bucket starts, a window and a
-- bucket past then, so past the end of every bucket it holds; but not when an odd bucket
-- starts and the key holds the even bucket before it, whose start set an expiry (every
-- version sets it when an even bucket starts) that already reaches the odd bucket's
-- end: one `PEXPIRE` for two buckets. rolling_save keeps the same rule.

-- The units of the key's fields (HGETALL) in buckets from oldest to current, and its
-- dead fields (nil when none); nil when the steps decide (a skew field, a bucket ahead
-- of current). The numbers are read by arithmetic on the strings: a field that is no
-- number raises an error, which rolling_try's pcall turns into "the steps decide"
-- (they delete it); tonumber() would cost Redis three times as much, twice per bucket.
local function rolling_live(fields, oldest, current)
  local sum, dead, before = 0, nil, false
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == 's' or name == 'b' then
      -- A skew, or a blocked key's mark: the steps decide.
      return nil
    end
    local index, count = name + 0, fields[i + 1] + 0
    -- (x % 1 == 0: a whole number, without a call, which costs as much as ten
    -- operations.)
    if count > 0 and count % 1 == 0 and index % 1 == 0 then
      if index > current then
        return nil
      end
      if index == current - 1 then
        before = true
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
  return sum, dead, before
end

local function rolling_try(KEYS, k, limit, buckets, interval, cost, now_us)
  -- (math.floor: a whole number, an integer in Lua 5.4 as well.)
  local now = floor(now_us / 1000)
  local current = floor(now / interval)
  local oldest = current - buckets + 1
  local fields = redis.call('HGETALL', KEYS[k])
  local sum, dead, before = 0, nil, false
  if #fields > 0 then
    local read
    read, sum, dead, before = pcall(rolling_live, fields, oldest, current)
    if not read or not sum then
      return false
    end
  end
  if sum + cost > limit then
    return false
  end
  return true, sum + cost, (current + buckets) * interval - now, current, dead,
    before and current % 2 == 1
end

local function rolling_commit(KEYS, k, dead, current, cost, cost_text, buckets, interval, kept)
  if dead then
    for i = 1, #dead, 500 do
      redis.call('HDEL', KEYS[k], unpack_list(dead, i, min(i + 499, #dead)))
    end
  end
  -- The key's expiry is set when its current bucket starts (see above: not when `kept`).
  -- With the callers' clocks, at every admission: buckets follow the caller's clock and
  -- the expiry the server's, so one set at a bucket's start (by a caller ahead, or while
  -- the server's clock was behind) may end before the bucket does. (Whole numbers below
  -- 10^17, as text unless native_numbers(). The cost goes as the client wrote it,
  -- `cost_text`.)
  local native = numbers_native
  local name = native and current or format('%d', current)
  if (redis.call('HINCRBY', KEYS[k], name, cost_text) == cost and not kept) or caller_time then
    local ttl = (buckets + 1) * interval
    redis.call('PEXPIRE', KEYS[k], native and ttl or format('%d', ttl))
  end
end

-- The fast settlement (src/backend/decide/fast.lua): rolling_charge (a `delta` above 0,
-- counted in the current bucket as rolling_try and rolling_commit count a check) or
-- rolling_refund (below 0: the newest buckets first, deleting those it empties), then
-- the steps' answer to a cost of 0, as the general engine runs a settlement. Returns
-- true, the sum after it and the ms until every counted unit has expired, when the
-- window admits then; else false, nothing written, and the steps settle (debt, whose
-- answer says which bucket's expiry pays it off; a skew; a bucket ahead of now; a
-- block's mark).
local function rolling_settle(KEYS, k, limit, buckets, interval, delta, delta_text, now_us)
  if delta > 0 then
    local ok, sum, t, current, dead, kept = rolling_try(KEYS, k, limit, buckets, interval,
      delta, now_us)
    if not ok then
      return false
    end
    rolling_commit(KEYS, k, dead, current, delta, delta_text, buckets, interval, kept)
    return true, sum, t
  end
  local now = floor(now_us / 1000)
  local current = floor(now / interval)
  local oldest = current - buckets + 1
  local fields = redis.call('HGETALL', KEYS[k])
  local sum = 0
  if #fields > 0 then
    local read
    read, sum = pcall(rolling_live, fields, oldest, current)
    if not read or not sum then
      return false
    end
  end
  local give = min(-delta, sum)
  if sum - give > limit then
    return false
  end
  -- The live buckets (rolling_live has read every field as a number), newest first.
  local live, names, counts = {}, {}, {}
  for i = 1, #fields, 2 do
    local index, count = fields[i] + 0, fields[i + 1] + 0
    if count > 0 and count % 1 == 0 and index % 1 == 0 and index >= oldest then
      live[#live + 1] = index
      names[index] = fields[i]
      counts[index] = count
    end
  end
  table.sort(live, function(x, y) return x > y end)
  local left = give
  for _, index in ipairs(live) do
    if left <= 0 then
      break
    end
    local name, count = names[index], counts[index]
    if left >= count then
      redis.call('HDEL', KEYS[k], name)
    else
      redis.call('HINCRBY', KEYS[k], name, -left)
    end
    left = left - count
  end
  return true, sum - give, (current + buckets) * interval - now
end
--## general
-- Rolling window of time buckets, as an algorithm of the engine (src/backend/decide/engine.lua),
-- with a = {limit, buckets, interval (ms)}: rolling_state(KEYS, k, a, now_us) reads the key
-- once, rolling_step(s, cost, write, keep) decides a check on that state (admitted when the
-- cost and `keep`, the units a priority class leaves to others, fit; with `write`,
-- counting the cost and marking the housekeeping; nothing goes to Redis), rolling_save(KEYS, k, s)
-- writes what the steps changed, once. `KEYS[k]` is a hash with one field per bucket: the
-- absolute bucket index floor(now_ms / interval) in decimal, holding that bucket's
-- count. A decision that does not write leaves the housekeeping to one that does.
-- A bucket is live while its index is above current - buckets; bucket i stops counting at
-- (i + buckets) * interval ms. Dead fields are deleted by every save after a writing
-- step, so the hash holds at most `buckets` fields. Large numbers go to Redis through
-- string.format('%d') so that they are never written in exponent notation.
-- A step returns {admitted (1/0), sum of the live buckets after the check, ms until this
-- cost could be admitted (0 when admitted), ms until every counted unit has expired}:
-- Reply: admitted, sum, retry_ms, reset_ms (src/backend/decide/protocol.rs: RollingReply)
-- A rejected request is not counted. With the server's time, every instance agrees on
-- bucket edges.
local function rolling_state(KEYS, k, a, now_us)
  local limit, buckets, interval = a[1], a[2], a[3]
  local now = math.floor(now_us / 1000)
  local current = math.floor(now / interval)
  -- Clock steps: the key's own time never goes back. With the server's clock, the key's
  -- time is the server's plus a skew of whole buckets, stored in the hash's field 's'
  -- (none normally). A bucket newer than the key's current one means the server's clock
  -- stepped back: the key's time then moves up to that bucket (the step counts as no
  -- time at all, as if no time had passed since the last request), and the skew is
  -- stored, so the key's time runs on at the server's rate: a step back never frees a
  -- unit, and never blocks the key longer than the window. The buckets stay where they
  -- are, in the key's time, and so does the hash's expiry: when the clock comes back,
  -- the window is as the key left it. Once the server's time reaches the newest bucket
  -- again (the clock came back, or caught up), the skew is dropped. A step forward
  -- expires buckets early.
  -- With the callers' clocks, a field newer than `current` is written by a caller whose
  -- clock is ahead: this caller counts from that bucket instead (moving the buckets back
  -- would age them once per such caller, without bound), so no unit ever expires before
  -- the clock furthest ahead says so.
  local newest = nil
  local stored_skew = 0
  -- A blocked key's mark (rolling_mark): field 'b'.
  local marked = false
  local fields = redis.call('HGETALL', KEYS[k])
  for i = 1, #fields, 2 do
    local index = tonumber(fields[i])
    local count = tonumber(fields[i + 1])
    if index and count and count > 0 and count % 1 == 0 and index % 1 == 0
        and (newest == nil or index > newest) then
      newest = index
    elseif fields[i] == 's' then
      stored_skew = count or 0
    elseif fields[i] == 'b' then
      marked = true
    end
  end
  local skew = 0
  if newest and newest > current then
    if caller_time then
      current = newest
    else
      skew = math.max(stored_skew, newest - current)
      current = current + skew
    end
  end
  local oldest = current - buckets + 1

  -- The live buckets by index, their indices in order, the fields to delete, the sum of
  -- the live counts. Every live index is at most `current`.
  -- (And whether the key holds the bucket before the current one: see rolling_save.)
  local live = {}
  local indices = {}
  local dead = {}
  local sum = 0
  local before = false
  for i = 1, #fields, 2 do
    local index = tonumber(fields[i])
    local count = tonumber(fields[i + 1])
    local valid = index and count and count > 0 and count % 1 == 0 and index % 1 == 0
    if valid and index == current - 1 then
      before = true
    end
    if valid and index >= oldest then
      sum = sum + count
      if not live[index] then
        live[index] = 0
        indices[#indices + 1] = index
      end
      live[index] = live[index] + count
    elseif fields[i] ~= 's' and fields[i] ~= 'b' then
      dead[#dead + 1] = fields[i]
    end
  end
  table.sort(indices)
  return { limit = limit, buckets = buckets, interval = interval,
    now = now + skew * interval, current = current, skew = skew,
    stored_skew = stored_skew, live = live, indices = indices, dead = dead,
    sum = sum, added = 0, marked = marked, before = before }
end

local function rolling_step(s, cost, write, keep)
  if write then
    s.housekeep = true
  end
  if s.sum + cost + keep <= s.limit then
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
  local need = s.sum + cost + keep - s.limit
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

local function rolling_save(KEYS, k, s)
  if not s.housekeep then
    return
  end
  -- Delete the dead buckets in chunks (unpack has a bounded stack).
  for i = 1, #s.dead, 500 do
    redis.call('HDEL', KEYS[k], unpack_list(s.dead, i, math.min(i + 499, #s.dead)))
  end
  if s.skew ~= s.stored_skew then
    if s.skew > 0 then
      redis.call('HSET', KEYS[k], 's', string.format('%d', s.skew))
    else
      redis.call('HDEL', KEYS[k], 's')
    end
  end
  if s.added > 0 then
    local count = redis.call('HINCRBY', KEYS[k], string.format('%d', s.current), s.added)
    -- Kept a window and a bucket past now in the key's time (so past now by the skew
    -- more on the server's clock), set when the current bucket starts, but for an odd
    -- bucket that follows the even one the key holds: that one's start set an expiry
    -- that reaches this one's end (as the fast path, see rolling_commit). With a skew
    -- (or one dropped now) and with the callers' clocks, at every write.
    if caller_time or s.skew > 0 or s.stored_skew > 0
        or (count == s.added and not (s.before and s.current % 2 == 1)) then
      redis.call('PEXPIRE', KEYS[k], string.format('%d', (s.buckets + 1 + s.skew) * s.interval))
    end
  end
end
-- Blocked keys (src/backend/decide/block.rs): the fast path reads the window's key
-- alone, so while a key is blocked its hash holds the field 'b', which the fast path
-- leaves to the steps (which read the block). rolling_mark(KEYS, k, ms) marks the key
-- for at least `ms` (a key that held nothing too); rolling_unmark(KEYS, k) takes the
-- mark off once the block has ended.
local function rolling_mark(KEYS, k, ms)
  redis.call('HSET', KEYS[k], 'b', '1')
  if redis.call('PTTL', KEYS[k]) < ms then
    redis.call('PEXPIRE', KEYS[k], string.format('%d', ms))
  end
end

local function rolling_unmark(KEYS, k)
  redis.call('HDEL', KEYS[k], 'b')
end
-- rolling_charge(s, cost): counts `cost` in the current bucket of state `s` whatever
-- the limit says (a settlement's extra cost): a sum above the limit is debt, which
-- refuses the key until enough of the oldest buckets have expired.
local function rolling_charge(s, cost)
  s.housekeep = true
  s.added = s.added + cost
  s.sum = s.sum + cost
  if not s.live[s.current] then
    s.live[s.current] = 0
    s.indices[#s.indices + 1] = s.current
  end
  s.live[s.current] = s.live[s.current] + cost
end
-- rolling_refund(KEYS, k, a, now_us, cost): takes `cost` units off the newest buckets first
-- (the units spent last), deleting the buckets it empties; expired buckets are left to
-- the next check.
local function rolling_refund(KEYS, k, a, now_us, cost)
  local buckets, interval = a[2], a[3]
  local current = math.floor(math.floor(now_us / 1000) / interval)
  local fields = redis.call('HGETALL', KEYS[k])
  for i = 1, #fields, 2 do
    if fields[i] == 's' then
      -- The key's time runs ahead of the server's (a step back of the server's clock).
      current = current + (tonumber(fields[i + 1]) or 0)
    end
  end
  local indices = {}
  local counts = {}
  for i = 1, #fields, 2 do
    local index = tonumber(fields[i])
    local count = tonumber(fields[i + 1])
    -- Live buckets, and buckets "in the future" (the clock stepped back further): both
    -- count.
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
      redis.call('HDEL', KEYS[k], string.format('%d', index))
    else
      redis.call('HINCRBY', KEYS[k], string.format('%d', index), -take)
    end
  end
end
