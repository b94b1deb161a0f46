-- Rolling window: the lean check (see src/backend/decide/lean.lua), placed before the general
-- steps (src/rolling/rolling.lua), whose rules it follows.
-- The lean check (src/backend/decide/lean.lua): the common case of rolling_state,
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

-- The lean settlement (src/backend/decide/lean.lua): rolling_charge (a `delta` above 0,
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
