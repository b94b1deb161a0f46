-- Fixed window: the lean check (see src/backend/decide/lean.lua), placed before the general
-- steps (src/period/period.lua), whose rules it follows.
-- Takes back what period_try counted (`count`: the count it left; `ttl`: the key's
-- expiry then, -1 for a key that held nothing, which is deleted again).
local function period_undo(KEYS, k, cost, count, ttl)
  if count == cost and ttl == -1 then
    redis.call('DEL', KEYS[k])
  else
    redis.call('INCRBY', KEYS[k], -cost)
  end
end

-- Calendar windows (src/period/calendar.rs): the caller sends four boundaries (Unix ms,
-- b0 < b1 < b2 < b3: the window before its own, its own, the next) from ARGV[at] on.
-- calendar_window(ARGV, at, t) returns the end and the length of the window holding t
-- (ms); a time outside them (a clock more than a window away from the caller's) gets a
-- window of the nearest one's length from t on. The same rule as `Bounds::window`.
-- The lean check runs a calendar window (letter 'c') as an aligned fixed window of that
-- length whose offset is minus its end: the edge the offset gives is then exactly the
-- end, since t lies within one length before it.
local function calendar_window(ARGV, at, t)
  local b0, b1, b2, b3 = to_number(ARGV[at]), to_number(ARGV[at + 1]), to_number(ARGV[at + 2]),
    to_number(ARGV[at + 3])
  if t < b0 then
    return t + b1 - b0, b1 - b0
  elseif t < b1 then
    return b1, b1 - b0
  elseif t < b2 then
    return b2, b2 - b1
  elseif t < b3 then
    return b3, b3 - b2
  end
  return t + b3 - b2, b3 - b2
end

-- A window that starts on KEYS[k], which holds `count`, this call's alone (0: nothing,
-- a refund's): false, the count deleted, while the key's block (KEYS[block]) runs (a
-- block ending this very millisecond is over, and deleted: see block_left in
-- engine.lua; no `block`: another limit's mark tells, a set's); else true and the ms
-- until the window ends, its expiry set when it counts anything (as period_save would).
local function period_start(KEYS, k, block, length, offset, count, now_us)
  if block then
    local blocked = redis.call('PTTL', KEYS[block])
    if blocked > 0 then
      redis.call('DEL', KEYS[k])
      return false
    elseif blocked == 0 then
      redis.call('DEL', KEYS[block])
    end
  end
  if not offset then
    if count > 0 then
      redis.call('PEXPIRE', KEYS[k], length)
    end
    return true, length
  end
  local now = floor(now_us / 1000)
  local deadline = now - ((now + offset) % length) + length
  if count > 0 then
    if caller_time then
      redis.call('PEXPIRE', KEYS[k], format('%d', deadline - now))
    else
      redis.call('PEXPIREAT', KEYS[k], format('%d', deadline))
    end
  end
  return true, deadline - now
end

-- The lean check (src/backend/decide/lean.lua): the common case of the steps
-- (src/period/period.lua) in the fewest commands, deciding exactly as they do.
-- period_try(KEYS, k, block, quota, length, offset, cost, cost_text, now_us) counts the
-- cost at once (INCRBY, with the cost as the client wrote it: Redis 7.0 writes a number
-- argument with snprintf, which costs more than the command) and returns true, the
-- count and the ms until the window ends when the key's window admits it as the steps
-- would; else it takes the count back and returns false, and the steps decide (a
-- refusal, a new window over a stale key, a skew, a clock step, a blocked key). A key
-- that held nothing starts its window here, as period_save would, unless the key's
-- block (KEYS[block]) is set: a window the key holds is marked while it is blocked
-- (period_mark), a window that starts is not. A `block` of nil starts it without reading
-- the block: a set's token bucket or rolling window is marked then, and leaves the set
-- to the steps (see `marks` in src/backend/decide/lean.lua).
local function period_try(KEYS, k, block, quota, length, offset, cost, cost_text, now_us)
  local count = redis.pcall('INCRBY', KEYS[k], cost_text)
  if type_of(count) ~= 'number' then
    -- "count skew": the steps decide.
    return false
  end
  local ttl = redis.call('PTTL', KEYS[k])
  if count == cost and ttl == -1 and cost <= quota then
    -- A new window.
    local started, t = period_start(KEYS, k, block, length, offset, count, now_us)
    if not started then
      return false
    end
    return true, count, t
  end
  if count ~= cost and ttl > 0 and ttl <= length and count <= quota then
    return true, count, ttl
  end
  period_undo(KEYS, k, cost, count, ttl)
  return false
end

-- The lean settlement (src/backend/decide/lean.lua): period_charge (a `delta` above 0)
-- or period_refund (below 0), then the steps' answer to a cost of 0, as the general
-- engine runs a settlement, in the fewest commands: the count moved at once (INCRBY,
-- `delta_text` as the client wrote it), as period_try counts. Returns true, the count
-- and the ms until the window ends (the caller compares the count with the quota: above
-- it, debt); else it takes the count back and returns false, and the steps settle (a
-- skew, a clock step, a blocked key, a count that lost its expiry). A charge on a key
-- that held nothing starts a window as period_try does (reading the key's block then,
-- unless `block` is nil, as there);
-- a refund that empties the window deletes it, and the answer is then the next
-- window's, as the steps' on a key that holds nothing. Its fourth and fifth results,
-- the key's expiry as read (-1: it held nothing) and the count before, are for
-- period_settle_undo.
local function period_settle(KEYS, k, block, length, offset, delta, delta_text, now_us)
  local count = redis.pcall('INCRBY', KEYS[k], delta_text)
  if type_of(count) ~= 'number' then
    return false
  end
  local ttl = redis.call('PTTL', KEYS[k])
  local before = count - delta
  -- The key held nothing (its window had ended: a window starts, with a charge), or a
  -- live window (2^52 and above: a blocked key's mark, see period_mark).
  local starts = ttl == -1 and before == 0
  local live = ttl > 0 and ttl <= length and before > 0 and before < 4503599627370496
  if live and count > 0 then
    return true, count, ttl, ttl, before
  elseif not starts and not live then
    period_undo(KEYS, k, delta, count, ttl)
    return false
  end
  -- A window that starts (a charge), or none (a refund: nothing held, or all given back;
  -- the block is read only when the key held nothing).
  if count <= 0 then
    redis.call('DEL', KEYS[k])
    count = 0
  end
  local ok, t = period_start(KEYS, k, starts and block or nil, length, offset, count, now_us)
  if not ok then
    return false
  end
  return true, count, t, ttl, before
end

-- Takes back what period_settle did (a set's settlement whose later limit leaves it to
-- the general engine): `delta`, the count it returned, and the expiry and count before.
-- A key that held nothing holds nothing again; a window still counting gets the delta
-- back; a window the refund emptied (deleted) is written again as it stood.
local function period_settle_undo(KEYS, k, delta, count, ttl, before)
  if ttl == -1 then
    redis.call('DEL', KEYS[k])
  elseif count > 0 then
    redis.call('INCRBY', KEYS[k], -delta)
  else
    redis.call('SET', KEYS[k], format('%d', before), 'PX', ttl)
  end
end
