-- The fast path, in three sections (see src/backend/decide/engine.rs): `locals`, the
-- library functions it calls as locals; `fast`, its check, after each algorithm's
-- `fast` section; `entry`, what every call runs first, which returns when the fast
-- path decides.
--## locals
-- The library functions the fast path calls on every decision, as locals of the
-- script: read through a global and a field at each call, each cost Redis 7.0 about
-- 200 instructions more (callgrind; a token bucket's check calls seven). A library of
-- Redis Functions may read no global while it loads, so bind_locals() sets them at a
-- call's start (the engine's entry, src/backend/decide/engine.rs), once per library
-- (once per call by EVALSHA, which runs the whole text at each call), and finds
-- native_numbers() there, which the fast path's writes then read as `numbers_native`.
local floor, ceil, max, min, format, to_number, type_of = nil, nil, nil, nil, nil, nil, nil
local function bind_locals()
  floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
  format, to_number, type_of = string.format, tonumber, type
  native_numbers()
end
--## fast
-- The fast path's check, after each algorithm's `fast` section (X.lua) and before the
-- general engine (src/backend/decide/engine.lua). On the EVALSHA path the script
-- returns at the entry when the fast path decides, so the general engine's functions
-- and tables are never built for it; with Redis Functions everything is built once per
-- library either way.

-- Packed replies: a limit's admit on the fast path is one negative integer (for Redis a table
-- reply costs more than the check's commands): limit i's n (remaining or count: at most
-- its capacity, so within its bits), its t (ms or µs) and its shape (0: a fixed
-- window's {1, n, t}; 1: {1, n, 0, t}), as -(v + 1) where
-- v = (t * 2^bits + n) * 128 + shape * 64 + bits, when v is below 2^53, that is when
-- t * 2^bits + n is below 2^46, which is asked before v is made (t < (2^46 - n) / 2^bits,
-- exact: a division by a power of two; in Lua 5.4 a product past 2^63 would wrap). An
-- admit's n is at most the limit's capacity, so a t below (2^46 - capacity) / 2^bits
-- (its member's [9]) always packs; a settlement's count may be above it (debt), and is
-- asked with its own n.
-- An admit too large to pack (a large limit's: a daily quota of 10^9 bytes) is wide:
-- three numbers, -(shape * 64) - 1 (bits 0, which no packed admit has: bits count at
-- least one), then n and t. A set's reply is its limits' admits in order, each packed
-- or wide, in one table; a batch's, every item's in one table (see `batch` in
-- engine.lua): a table in a table costs Redis about 4 500 instructions to reply.
-- Written out where they are made (a call costs Redis as much as ten operations); read
-- back by `engine::reply_numbers` and `engine::batch_numbers`
-- (src/backend/decide/engine.rs).

-- A limit's (its member `m`, see list_of) admitted reply `r` of the general engine
-- ({1, n, t} or {1, n, 0, t}) as its admit in `out` from `pos`, packed or wide
-- (coalesced checks, 'm' in engine.lua): returns the position after it, or nil when `r`
-- is not of those shapes.
local function put_admit(out, pos, m, r)
  local n, t, shape = r[2], r[3], 0
  if r[4] then
    if t ~= 0 then
      return nil
    end
    t, shape = r[4], 1
  end
  if n < 0 or t < 0 then
    return nil
  elseif t < (70368744177664 - n) / m[5] then
    out[pos] = -((t * m[5] + n) * 128 + shape * 64 + m[4]) - 1
    return pos + 1
  end
  out[pos], out[pos + 1], out[pos + 2] = -shape * 64 - 1, n, t
  return pos + 3
end

-- The fast path of a set's limits from limit i on (n limits, limit i's key KEYS[k + i],
-- their block KEYS[k + n + 1]; `cost` and its text `cost_text` the check's; `now_us`: the
-- time when read; ARGV[bounds_at]: the next calendar window's boundaries): limit i
-- tries, and writes its admit in `out` from `pos` (packed or wide, see above), then the
-- limits after it, and only when they all admit does limit i write its key (or, when
-- one does not, take back what it counted). Returns the position after the last
-- limit's admit, or nil (the general engine decides; what this wrote in `out` is the
-- caller's to take back). Each limit's values wait in its call's locals (a table for
-- them costs Redis more). With `keeps` (a priority class's check), limit i admits only
-- when keeps[i] units more would fit too.
local function fast_from(KEYS, ARGV, L, k, cost, cost_text, n, i, now_us, bounds_at, out, pos,
    keeps)
  local m = L.members[i]
  local kind = m[1]
  -- What a priority class leaves to others of this limit; a window's limit less that.
  local keep = keeps and keeps[i]
  local capacity = m[6]
  if keep then
    capacity = capacity - keep
  end
  -- A member that counts requests spends one.
  local spent, spent_text = cost, cost_text
  if m[3] then
    spent, spent_text = 1, '1'
  end
  local ok, r1, r2, c1, c2, c3
  if kind == 't' then
    now_us = now_us or unix_us(ARGV)
    ok, r1, r2, c1, c2, c3 = token_bucket_try(redis.call('GET', KEYS[k + i]), m[6], m[7], m[8],
      spent, now_us, keep)
  elseif kind == 'w' then
    -- A fixed window. (The block is read when the window starts, unless another limit's
    -- mark tells: m[12].)
    local offset = m[8]
    if offset then
      now_us = now_us or unix_us(ARGV)
    end
    ok, r1, r2 = period_try(KEYS, k + i, m[12] and k + n + 1, capacity, m[7], offset, spent,
      spent_text, now_us)
  elseif kind == 'c' then
    -- A calendar window: one aligned to the end of the window holding now (its
    -- boundaries in ARGV, four per calendar member), taken back as a fixed window.
    now_us = now_us or unix_us(ARGV)
    local deadline, length = calendar_window(ARGV, bounds_at, floor(now_us / 1000))
    bounds_at = bounds_at + 4
    kind = 'w'
    ok, r1, r2 = period_try(KEYS, k + i, m[12] and k + n + 1, capacity, length, -deadline,
      spent, spent_text, now_us)
  else
    now_us = now_us or unix_us(ARGV)
    ok, r1, r2, c1, c2, c3 = rolling_try(KEYS, k + i, capacity, m[7], m[8], spent, now_us)
  end
  if not ok then
    return nil
  end
  -- (Packed or wide: see above.)
  local after = pos + 1
  if r2 < m[9] then
    out[pos] = -((r2 * m[5] + r1) * 128 + m[10]) - 1
  else
    out[pos], out[pos + 1], out[pos + 2] = m[11], r1, r2
    after = pos + 3
  end
  if i < n then
    after = fast_from(KEYS, ARGV, L, k, cost, cost_text, n, i + 1, now_us, bounds_at, out, after,
      keeps)
    if not after then
      -- A later limit does not admit: what a fixed window counted is taken back. (A
      -- window it started, the count the cost: a key that held nothing.)
      if kind == 'w' then
        period_undo(KEYS, k + i, spent, r1, r1 == spent and -1 or 1)
      end
      return nil
    end
  end
  if kind == 't' then
    token_bucket_commit(KEYS, k + i, c1, c2, c3)
  elseif kind == 'r' then
    rolling_commit(KEYS, k + i, c2, c1, spent, spent_text, m[7], m[8], c3)
  end
  return after
end

-- The fast path: a check ('c') that every limit admits on its state as the steps would
-- (the common case), decided in the fewest commands and tables by each algorithm's
-- X_try, then written by X_commit (a fixed window counts in its try, and is taken back
-- with period_undo when a later limit does not admit). Returns the engine's reply
-- (packed: one limit's as a number, or a table of its wide admit; a set's as a table of
-- its limits' admits), or nil when the general engine below decides (a blocked key, a
-- refusal, a skew, a clock step), with nothing changed. The check's n limits have their
-- keys from KEYS[k + 1] and their block KEYS[k + n + 1] (k: 0 but in a batch, see
-- `batch` in engine.lua); `cost` and `cost_text` are its cost, as a number and as sent;
-- `now_us` the time if already read. With `out` (a batch's reply), the limits' admits
-- go there from `pos`, and it returns the position after them (or nil, what it wrote
-- there the caller's to take back). With `keeps` (a priority class's check, 'h': one
-- number per limit), each limit admits only when its keep would fit too.
-- Each limit's own key is all it reads: a blocked key's limits are marked (X_mark: the
-- engine marks them when it blocks a key, and the fast path leaves a marked key to the
-- engine), and a fixed window reads the block only when its window starts.
local function fast_check(KEYS, ARGV, L, k, n, cost, cost_text, now_us, out, pos, keeps)
  if n == 1 then
    local keep = keeps and keeps[1]
    -- One limit (L: its letter, its count of arguments, its arguments): the reply made
    -- at once.
    local kind = L[1]
    local ok, count, t
    if kind == 't' then
      local tat, now, tau
      ok, count, t, tat, now, tau = token_bucket_try(redis.call('GET', KEYS[k + 1]), L[3], L[4],
        L[5], cost, now_us or unix_us(ARGV), keep)
      if not ok then
        return nil
      end
      token_bucket_commit(KEYS, k + 1, tat, now, tau)
    else
      -- A window's limit (less what a priority class leaves to others).
      local quota = L[3]
      if keep then
        quota = quota - keep
      end
      if kind == 'w' then
        -- (L[5]: the offset of an aligned window, nil for one that starts at the first
        -- request.)
        local offset = L[5]
        ok, count, t = period_try(KEYS, k + 1, k + 2, quota, L[4], offset, cost, cost_text,
          offset and (now_us or unix_us(ARGV)))
      elseif kind == 'r' then
        local current, dead, kept
        ok, count, t, current, dead, kept = rolling_try(KEYS, k + 1, quota, L[4], L[5], cost,
          now_us or unix_us(ARGV))
        if ok then
          rolling_commit(KEYS, k + 1, dead, current, cost, cost_text, L[4], L[5], kept)
        end
      elseif kind == 'c' then
        -- A calendar window (its boundaries in ARGV[3] to ARGV[6]): a fixed window of the
        -- length of the window holding now, aligned to its end.
        now_us = now_us or unix_us(ARGV)
        local deadline, length = calendar_window(ARGV, 3, floor(now_us / 1000))
        ok, count, t = period_try(KEYS, k + 1, k + 2, quota, length, -deadline, cost, cost_text,
          now_us)
      end
      if not ok then
        return nil
      end
    end
    -- (Packed or wide: see above.)
    local m = L.members[1]
    if t < m[9] then
      local packed = -((t * m[5] + count) * 128 + m[10]) - 1
      if out then
        out[pos] = packed
        return pos + 1
      end
      return packed
    elseif out then
      out[pos], out[pos + 1], out[pos + 2] = m[11], count, t
      return pos + 3
    end
    return { m[11], count, t }
  elseif out then
    return fast_from(KEYS, ARGV, L, k, cost, cost_text, n, 1, now_us, 3, out, pos, keeps)
  end
  -- (A pair's table made at the size of a packed and a wide admit, the common pair:
  -- a table that grows costs Redis more than two slots emptied.)
  out = n == 2 and { false, false, false, false } or {}
  local after = fast_from(KEYS, ARGV, L, k, cost, cost_text, n, 1, now_us, 3, out, 1, keeps)
  if after then
    for x = after, 4 do
      out[x] = nil
    end
    return out
  end
  return nil
end

-- Coalesced checks of one key ('m', see engine.lua) of one limit, as the fast path
-- decides them: each check's reply is what its own call would reply after the checks
-- before it. A token bucket tries each cost in turn (from ARGV[3] on) on the TAT the
-- checks before it left, the key read once and written once; a window (fixed, aligned,
-- calendar, rolling) tries their sum at once, which admits every check when it admits
-- (a window's count only grows within a call: each check's count is the one the key
-- held before the call and the costs up to its own, its time the sum's). Returns the
-- call's reply as the engine's for 'm' (the count of limits, 1, then each check's
-- admit, packed or wide), or nil when that is not the fast path's case (a refusal, a skew, a
-- block's mark): the general engine then decides them all, nothing having been written.
-- `shared`: the checks all cost the same, their cost the one number sent ('M').
local function fast_coalesced(KEYS, ARGV, L, count, shared, now_us)
  local m = L.members[1]
  local kind, power, low, wide = L[1], m[5], m[10], m[11]
  local out, pos = { 1 }, 2
  -- Check j's cost is ARGV[at + j] (the costs follow a calendar window's four
  -- boundaries), or `each`, the one cost sent, read once (a conversion per check costs
  -- Redis about 70 instructions).
  local at = kind == 'c' and 6 or 2
  local each = shared and ARGV[at + 1] + 0
  if kind == 't' then
    local interval, burst, epoch = L[3], L[4], L[5]
    local value = redis.call('GET', KEYS[1])
    local ok, left, full, now, tau
    for j = 1, count do
      ok, left, full, value, now, tau = token_bucket_try(value, interval, burst, epoch,
        each or ARGV[at + j] + 0, now_us)
      if not ok then
        return nil
      end
      -- (Packed or wide: see above.)
      if full < m[9] then
        out[pos] = -((full * power + left) * 128 + low) - 1
        pos = pos + 1
      else
        out[pos], out[pos + 1], out[pos + 2] = wide, left, full
        pos = pos + 3
      end
    end
    token_bucket_commit(KEYS, 1, value, now, tau)
    return out
  end
  if kind ~= 'w' and kind ~= 'c' and kind ~= 'r' then
    return nil
  end
  local total = 0
  if each then
    total = count * each
  else
    for j = 1, count do
      total = total + ARGV[at + j]
    end
  end
  local ok, sum, t
  if kind == 'r' then
    local current, dead, kept
    ok, sum, t, current, dead, kept = rolling_try(KEYS, 1, L[3], L[4], L[5], total, now_us)
    if not ok then
      return nil
    end
    rolling_commit(KEYS, 1, dead, current, total, total, L[4], L[5], kept)
  else
    local length, offset = L[4], L[5]
    if kind == 'c' then
      local deadline = nil
      deadline, length = calendar_window(ARGV, 3, floor(now_us / 1000))
      offset = -deadline
    end
    ok, sum, t = period_try(KEYS, 1, 2, L[3], length, offset, total, total, now_us)
    if not ok then
      return nil
    end
  end
  local n = sum - total
  for j = 1, count do
    n = n + (each or ARGV[at + j])
    -- (Packed or wide: see above.)
    if t < m[9] then
      out[pos] = -((t * power + n) * 128 + low) - 1
      pos = pos + 1
    else
      out[pos], out[pos + 1], out[pos + 2] = wide, n, t
      pos = pos + 3
    end
  end
  return out
end

-- The fast settlement of a set's n limits (their keys from KEYS[k + 1], their block
-- KEYS[k + n + 1], as the fast path's; `now_us` the time if already read): each limit
-- that counts cost settles by `delta` as its own fast settlement would (X_settle), and a
-- member that counts requests (settling nothing) says where it stands (a token bucket's
-- try of a cost of 0). All or nothing: a token bucket's write and a rolling window's
-- charge wait until every limit has settled; a fixed window counts at once and is taken
-- back (period_settle_undo) when a later limit leaves the settlement to the general
-- engine; a rolling window's refund, which writes as it goes, is made last (one per
-- set). Returns the engine's answer (every limit's admit packed, as the fast path's;
-- with a limit in debt, the engine's table), or nil, nothing written: a member counting
-- requests that is not a token bucket, two rolling refunds, and whatever a limit's own
-- fast settlement leaves to the engine.
local function fast_settle_set(KEYS, ARGV, L, k, n, delta, delta_text, now_us)
  now_us = now_us or unix_us(ARGV)
  local members = L.members
  local bounds_at = 3
  -- Each limit's answer (admitted, count, µs to wait or nil for a window's shape, t) and
  -- its deferred write; the windows' undo (limit, count, ttl, before); the rolling refund.
  local admits, counts, waits, ts, later = {}, {}, {}, {}, {}
  local undo, last = nil, nil
  local ok = true
  for i = 1, n do
    local m = members[i]
    local kind, at = m[1], m[2]
    local length, offset = L[at + 3], nil
    if kind == 'c' then
      local deadline
      deadline, length = calendar_window(ARGV, bounds_at, floor(now_us / 1000))
      bounds_at = bounds_at + 4
      offset = -deadline
    elseif kind == 'w' and L[at + 1] > 2 then
      offset = L[at + 4]
    end
    if m[3] then
      ok = kind == 't'
      if ok then
        ok, counts[i], ts[i] = token_bucket_try(redis.call('GET', KEYS[k + i]), L[at + 2],
          L[at + 3], L[at + 4], 0, now_us)
        admits[i], waits[i] = true, 0
      end
    elseif kind == 't' then
      local d = {}
      ok, admits[i], counts[i], waits[i], ts[i] = token_bucket_settle(KEYS, k + i,
        redis.call('GET', KEYS[k + i]), L[at + 2], L[at + 3], L[at + 4], delta, now_us, d)
      later[i] = d
    elseif kind == 'w' or kind == 'c' then
      local ttl, before
      ok, counts[i], ts[i], ttl, before = period_settle(KEYS, k + i, m[12] and k + n + 1,
        length, offset, delta, delta_text, now_us)
      if ok then
        admits[i] = counts[i] <= L[at + 2]
        undo = undo or {}
        undo[#undo + 1] = { i, counts[i], ttl, before }
      end
    elseif delta > 0 then
      local current, dead, kept
      ok, counts[i], ts[i], current, dead, kept = rolling_try(KEYS, k + i, L[at + 2],
        L[at + 3], L[at + 4], delta, now_us)
      admits[i], waits[i], later[i] = true, 0, { current, dead, kept }
    else
      ok = not last
      last = i
    end
    if not ok then
      break
    end
  end
  if ok and last then
    local at = members[last][2]
    ok, counts[last], ts[last] = rolling_settle(KEYS, k + last, L[at + 2], L[at + 3],
      L[at + 4], delta, delta_text, now_us)
    admits[last], waits[last] = true, 0
  end
  if not ok then
    for _, u in ipairs(undo or {}) do
      period_settle_undo(KEYS, k + u[1], delta, u[2], u[3], u[4])
    end
    return nil
  end
  local all = true
  for i = 1, n do
    local d = later[i]
    if d then
      local at = members[i][2]
      if members[i][1] == 't' then
        if d[1] then
          token_bucket_write(KEYS, k + i, d[1], d[2], d[3], d[4])
        end
      else
        rolling_commit(KEYS, k + i, d[2], d[1], delta, delta_text, L[at + 3], L[at + 4], d[3])
      end
    end
    all = all and admits[i]
  end
  if not all then
    -- A limit in debt: the engine's table (each limit's answer to a cost of 0).
    local out = { 0, 0 }
    for i = 1, n do
      out[#out + 1] = admits[i] and 1 or 0
      out[#out + 1] = counts[i]
      if waits[i] then
        out[#out + 1] = waits[i]
      end
      out[#out + 1] = ts[i]
    end
    return out
  end
  -- (Packed or wide: see above, as the fast path's.)
  local out, pos = n == 2 and { false, false } or {}, 1
  for i = 1, n do
    local count, t, m = counts[i], ts[i], members[i]
    if t < (70368744177664 - count) / m[5] then
      out[pos] = -((t * m[5] + count) * 128 + m[10]) - 1
      pos = pos + 1
    else
      out[pos], out[pos + 1], out[pos + 2] = m[11], count, t
      pos = pos + 3
    end
  end
  return out
end

-- The fast settlement ('s', see engine.lua) of one limit by `delta` (and its text
-- `delta_text`, as sent): each algorithm's X_settle charges it (above 0: spent whatever
-- the limit says, debt past it) or gives it back (below 0) on the limit's own key, and
-- says where the limit stands then, as the general engine's settlement would (its
-- answer to a cost of 0): an admit packed, as the fast path's; a refusal (debt) as
-- the engine's table. Returns nil when the general engine settles (a block's mark, a
-- skew, a step back, a rolling window in debt, a settlement of 0), nothing written.
-- A set's (n limits) is fast_settle_set's.
local function fast_settle(KEYS, ARGV, L, k, n, delta, delta_text, now_us)
  if delta == 0 then
    return nil
  elseif n > 1 then
    return fast_settle_set(KEYS, ARGV, L, k, n, delta, delta_text, now_us)
  end
  local kind = L[1]
  local ok, admitted, n, wait, t
  local shape = 1
  if kind == 't' then
    ok, admitted, n, wait, t = token_bucket_settle(KEYS, k + 1, redis.call('GET', KEYS[k + 1]),
      L[3], L[4], L[5], delta, now_us or unix_us(ARGV))
  elseif kind == 'w' or kind == 'c' then
    local length, offset = L[4], L[5]
    if kind == 'c' then
      now_us = now_us or unix_us(ARGV)
      local deadline = nil
      deadline, length = calendar_window(ARGV, 3, floor(now_us / 1000))
      offset = -deadline
    elseif offset then
      now_us = now_us or unix_us(ARGV)
    end
    ok, n, t = period_settle(KEYS, k + 1, k + 2, length, offset, delta, delta_text, now_us)
    admitted = ok and n <= L[3]
    shape = 0
  elseif kind == 'r' then
    ok, n, t = rolling_settle(KEYS, k + 1, L[3], L[4], L[5], delta, delta_text,
      now_us or unix_us(ARGV))
    admitted = true
  end
  if not ok then
    return nil
  end
  if not admitted then
    if shape == 0 then
      return { 0, 0, 0, n, t }
    end
    return { 0, 0, 0, n, wait, t }
  end
  -- (Packed: see above.)
  local m = L.members[1]
  if t < (70368744177664 - n) / m[5] then
    return -((t * m[5] + n) * 128 + m[10]) - 1
  elseif shape == 0 then
    return { 1, 0, 1, n, t }
  end
  return { 1, 0, 1, n, 0, t }
end
--## entry
-- Every call: the locals bound (once per library), the head's and the limits' words
-- (read from the library's lists when it holds them, without a call), then the fast
-- path for a check (and for coalesced checks of one limit, and a settlement of one
-- limit), which returns when it decides; else the general engine's `return` follows.
if not floor then
  bind_locals()
end
local H = texts[1][ARGV[1]] or list_of(1, ARGV[1])
local L = texts[2][ARGV[2]] or list_of(2, ARGV[2])
if H[1] == 'c' then
  local out = fast_check(KEYS, ARGV, L, 0, #KEYS - 1, H[2], H[4], nil)
  if out then
    return out
  end
elseif H[1] == 'h' then
  -- A priority class's check: each limit within what the class leaves to others (one
  -- extra number per limit, after the calendar windows' four boundaries each).
  local members, at, keeps = L.members, 3, {}
  for i = 1, #members do
    if members[i][1] == 'c' then
      at = at + 4
    end
  end
  for i = 1, #members do
    keeps[i] = ARGV[at + i - 1] + 0
  end
  local out = fast_check(KEYS, ARGV, L, 0, #KEYS - 1, H[2], H[4], nil, nil, nil, keeps)
  if out then
    return out
  end
elseif (H[1] == 'm' or H[1] == 'M') and #KEYS == 2 then
  local out = fast_coalesced(KEYS, ARGV, L, H[2], H[1] == 'M', unix_us(ARGV))
  if out then
    return out
  end
elseif H[1] == 's' then
  local out = fast_settle(KEYS, ARGV, L, 0, #KEYS - 1, H[2], H[4], nil)
  if out then
    return out
  end
end
