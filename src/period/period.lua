-- Fixed window in the engine, in two sections (see src/backend/decide/engine.rs, which
-- places every file's sections): `fast`, its part of the fast path
-- (src/backend/decide/fast.lua), and `general`, its steps for the general engine
-- (src/backend/decide/engine.lua), whose rules the fast path follows.
--## fast
-- Fixed window: the fast path (see src/backend/decide/fast.lua), placed before the general
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
-- The fast path runs a calendar window (letter 'c') as an aligned fixed window of that
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

-- The fast path (src/backend/decide/fast.lua): the common case of the steps
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
-- to the steps (see `marks` in src/backend/decide/fast.lua).
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

-- The fast settlement (src/backend/decide/fast.lua): period_charge (a `delta` above 0)
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
--## general
-- Fixed window, as an algorithm of the engine (src/backend/decide/engine.lua), with a = {quota,
-- period (ms), UTC offset (ms) to align windows to, or nil for windows that start at the
-- first request; for a calendar window, a.argv and a.bounds: the call's ARGV and where
-- its four boundaries are (calendar_window, src/period/period.lua)}:
-- period_state(KEYS, k, a, now_us) reads the key once, period_step(s, cost, write, keep)
-- decides a check on that state (admitted when the cost and `keep`, the units a priority
-- class leaves to others, fit; with `write`, counting the cost; nothing goes to Redis),
-- period_save(KEYS, k, s) writes what the steps changed, once. `KEYS[k]` holds the count, with
-- the window's end as its expiry (counted by the server).
-- A step returns {admitted (1/0), count, ms until the window ends}:
-- Reply: admitted, count, window_ms (src/backend/decide/protocol.rs: WindowReply)
-- A rejected request is not counted. Time is used only to align a new window. Large numbers go to Redis
-- through string.format('%d') so that they are never written in exponent notation.
-- Clock steps (server's clock): the key has its own time, the server's plus a skew (ms)
-- stored with the count ("count skew"; none normally, the count alone). A window whose
-- end is more than one period away means the server's clock stepped back: the key's
-- time is then the later of (server's time + stored skew) and (end - period), so the
-- count is kept and the window ends within one period of the step, and the new skew is
-- stored. The key's expiry is never moved: it stays the window's end in the key's time,
-- so when the clock comes back the window is as the key left it. A window that ends in
-- the key's time while the clock is behind starts the next one in the key's time. Once
-- the end is within one period of the server's time again (the clock came back, or
-- caught up), the skew is dropped. A step forward ends a window early. With the callers'
-- clocks, a window more than a period away is cut to end within one period (as the
-- server's expiry cannot tell a step back of the server's clock from anything else).
-- A calendar window's period is the length of the window that holds the time read (the
-- server's, or the caller's); a new window ends at the end of the window holding the
-- key's time.
local function period_state(KEYS, k, a, now_us)
  local quota, length, offset = a[1], a[2], a[3]
  if a.bounds then
    local _
    _, length = calendar_window(a.argv, a.bounds, math.floor(now_us / 1000))
  end
  local raw = redis.call('GET', KEYS[k])
  local count, skew, marked = 0, 0, false
  if raw then
    count = tonumber(raw)
    if count == nil then
      local at = string.find(raw, ' ', 1, true)
      count = at and tonumber(string.sub(raw, 1, at - 1)) or 0
      skew = at and tonumber(string.sub(raw, at + 1)) or 0
    end
    if count >= 4503599627370496 then
      -- A blocked key's mark (period_mark).
      count = count - 4503599627370496
      marked = true
    end
  end
  local ttl = redis.call('PTTL', KEYS[k])
  -- A window ends at its expiry: a PTTL of 0 is a key expiring this very millisecond
  -- (Redis still holds it), which is already the next window.
  local s = { quota = quota, length = length, count = count, ttl = ttl, added = 0,
    skew = 0, stored_skew = skew, marked = marked }
  s.fresh = count == 0 or ttl <= 0
  if not s.fresh and ttl > length then
    if caller_time then
      s.stepped = true
      s.ttl = length
    else
      -- The server clock stepped back (Redis expiries are Unix times).
      s.skew = math.max(skew, ttl - length)
      s.ttl = ttl - s.skew
      -- The window has ended in the key's time: the next one starts.
      s.fresh = s.ttl <= 0
    end
  end
  if s.fresh then
    -- A new window, or a counter that lost its expiry (it must not live forever).
    s.count = 0
    if a.bounds then
      local now = math.floor(now_us / 1000) + s.skew
      s.deadline = calendar_window(a.argv, a.bounds, now)
      s.ttl = s.deadline - now
    elseif offset then
      local now = math.floor(now_us / 1000) + s.skew
      s.deadline = now - ((now + offset) % length) + length
      s.ttl = s.deadline - now
    else
      s.ttl = length
    end
  end
  return s
end

local function period_step(s, cost, write, keep)
  if write and (s.stepped or s.skew ~= s.stored_skew) then
    s.rekey = true
  end
  if s.count + cost + keep > s.quota then
    return {0, s.count, s.ttl}
  end
  if write then
    s.count = s.count + cost
    s.added = s.added + cost
    return {1, s.count, s.ttl}
  end
  return {1, s.count + cost, s.ttl}
end

local function period_save(KEYS, k, s)
  if s.stepped and s.rekey then
    -- Callers' clocks: cut the window to one period.
    redis.call('PEXPIRE', KEYS[k], string.format('%d', s.length))
  elseif s.skew > 0 or s.stored_skew > 0 then
    -- A key whose time is not the server's: the count and the skew in one value. The
    -- expiry is the window's end in the key's time: set with a new window, then kept.
    if s.added == 0 and not s.rekey then
      return
    end
    local value = string.format('%d', s.count)
    if s.skew > 0 then
      value = string.format('%d %d', s.count, s.skew)
    end
    if s.fresh then
      if s.added == 0 then
        return
      end
      redis.call('SET', KEYS[k], value, 'PX', string.format('%d', s.ttl + s.skew))
    else
      redis.call('SET', KEYS[k], value, 'KEEPTTL')
    end
    return
  end
  if s.added == 0 then
    return
  end
  if not s.fresh then
    redis.call('INCRBY', KEYS[k], s.added)
  elseif s.deadline and not caller_time then
    -- The server's own clock: end exactly on the edge (PEXPIREAT: some servers
    -- refuse SET's PXAT).
    redis.call('SET', KEYS[k], s.count)
    redis.call('PEXPIREAT', KEYS[k], string.format('%d', s.deadline))
  else
    -- The caller's clock is not the server's: the edge as a time to live.
    redis.call('SET', KEYS[k], s.count, 'PX', string.format('%d', s.ttl))
  end
end
-- period_charge(s, cost): counts `cost` on state `s` whatever the quota says (a
-- settlement's extra cost): a count above the quota is debt, which refuses the key
-- until the window ends; the next window starts afresh (the debt ends with its window).
local function period_charge(s, cost)
  if s.stepped or s.skew ~= s.stored_skew then
    s.rekey = true
  end
  s.count = s.count + cost
  s.added = s.added + cost
end
-- period_refund(KEYS, k, a, now_us, cost): gives `cost` units back to the current window (a
-- window emptied by it is deleted: the next request starts a new one).
local function period_refund(KEYS, k, a, now_us, cost)
  local raw = redis.call('GET', KEYS[k]) or '0'
  local count = tonumber(raw)
  local at = nil
  if count == nil then
    at = string.find(raw, ' ', 1, true)
    count = at and tonumber(string.sub(raw, 1, at - 1)) or 0
  end
  -- A blocked key's mark (period_mark) stays.
  local mark = 0
  if count >= 4503599627370496 then
    mark = 4503599627370496
    count = count - mark
  end
  if count > 0 and redis.call('PTTL', KEYS[k]) > 0 then
    if count <= cost and mark == 0 then
      redis.call('DEL', KEYS[k])
    elseif at then
      -- With a skew: the value is rewritten, its expiry kept.
      redis.call('SET', KEYS[k],
        string.format('%d', mark + count - math.min(cost, count)) .. string.sub(raw, at),
        'KEEPTTL')
    else
      redis.call('DECRBY', KEYS[k], math.min(cost, count))
    end
  end
end
-- Blocked keys (src/backend/decide/block.rs): the fast path counts on the window's
-- key alone, so while a key is blocked its window is marked: its count carries 2^52
-- more (read back by period_state and period_refund), which no quota admits, so the
-- fast path leaves it to the steps (which read the block). A window that starts
-- while the key is blocked starts on a key that held nothing: the fast path reads
-- the block then (period_try). period_mark(KEYS, k, ms) marks the window the key
-- holds; period_unmark(KEYS, k) takes the mark off once the block has ended. (2^52 as
-- text: Lua 5.1 would write the number in exponent notation.)
-- (The window's count moved by the mark, onto it (`on`) or off it, when it is not
-- where `on` wants it; a count with a skew is rewritten, its expiry kept.)
local function period_move_mark(KEYS, k, on)
  local raw = redis.call('GET', KEYS[k])
  if not raw then
    return
  end
  local at = string.find(raw, ' ', 1, true)
  local count = tonumber(at and string.sub(raw, 1, at - 1) or raw)
  if count == nil or (count >= 4503599627370496) == on then
    return
  end
  if at then
    local by = on and 4503599627370496 or -4503599627370496
    redis.call('SET', KEYS[k], string.format('%d', count + by) .. string.sub(raw, at),
      'KEEPTTL')
  else
    redis.call('INCRBY', KEYS[k], on and '4503599627370496' or '-4503599627370496')
  end
end

local function period_mark(KEYS, k, _)
  period_move_mark(KEYS, k, true)
end

local function period_unmark(KEYS, k)
  period_move_mark(KEYS, k, false)
end
