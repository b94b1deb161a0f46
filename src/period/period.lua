-- Fixed window, as an algorithm of the engine (src/backend/decide/engine.lua), with a = {quota,
-- period (ms), UTC offset (ms) to align windows to, or nil for windows that start at the
-- first request; for a calendar window, a.argv and a.bounds: the call's ARGV and where
-- its four boundaries are (calendar_window, src/period/period_lean.lua)}:
-- period_state(KEYS, k, a, now_us) reads the key once, period_step(s, cost, write) decides
-- a check on that state (with `write`, counting it; nothing goes to Redis),
-- period_save(KEYS, k, s) writes what the steps changed, once. `KEYS[k]` holds the count, with
-- the window's end as its expiry (counted by the server).
-- A step returns {admitted (1/0), count, ms until the window ends}. A rejected request
-- is not counted. Time is used only to align a new window. Large numbers go to Redis
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

local function period_step(s, cost, write)
  if write and (s.stepped or s.skew ~= s.stored_skew) then
    s.rekey = true
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
-- Blocked keys (src/backend/decide/block.rs): the lean check counts on the window's
-- key alone, so while a key is blocked its window is marked: its count carries 2^52
-- more (read back by period_state and period_refund), which no quota admits, so the
-- lean check leaves it to the steps (which read the block). A window that starts
-- while the key is blocked starts on a key that held nothing: the lean check reads
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
