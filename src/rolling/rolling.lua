-- Rolling window of time buckets, as an algorithm of the engine (src/backend/decide/engine.lua),
-- with a = {limit, buckets, interval (ms)}: rolling_state(KEYS, k, a, now_us) reads the key
-- once, rolling_step(s, cost, write) decides a check on that state (with `write`,
-- counting it and marking the housekeeping; nothing goes to Redis), rolling_save(KEYS, k, s)
-- writes what the steps changed, once. `KEYS[k]` is a hash with one field per bucket: the
-- absolute bucket index floor(now_ms / interval) in decimal, holding that bucket's
-- count. A decision that does not write leaves the housekeeping to one that does.
-- A bucket is live while its index is above current - buckets; bucket i stops counting at
-- (i + buckets) * interval ms. Dead fields are deleted by every save after a writing
-- step, so the hash holds at most `buckets` fields. Large numbers go to Redis through
-- string.format('%d') so that they are never written in exponent notation.
-- A step returns {admitted (1/0), sum of the live buckets after the check, ms until this
-- cost could be admitted (0 when admitted), ms until every counted unit has expired}.
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

local function rolling_step(s, cost, write)
  if write then
    s.housekeep = true
  end
  if s.sum + cost <= s.limit then
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
  local need = s.sum + cost - s.limit
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
    -- that reaches this one's end (as the lean check, see rolling_commit). With a skew
    -- (or one dropped now) and with the callers' clocks, at every write.
    if caller_time or s.skew > 0 or s.stored_skew > 0
        or (count == s.added and not (s.before and s.current % 2 == 1)) then
      redis.call('PEXPIRE', KEYS[k], string.format('%d', (s.buckets + 1 + s.skew) * s.interval))
    end
  end
end
-- Blocked keys (src/backend/decide/block.rs): the lean check reads the window's key
-- alone, so while a key is blocked its hash holds the field 'b', which the lean check
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
