-- The lean check, first part of the engine's text (before the general engine,
-- src/backend/engine.lua): the algorithms' lean functions (X_lean.lua) are placed before
-- it, after the time prelude. On the EVALSHA path the script returns here when the lean
-- check decides, so the general engine's functions and tables are never built for it;
-- with Redis Functions everything is built once per library either way.
-- The limits' text (ARGV[4]) read into a list of its words, numbers as numbers. A
-- limiter sends the same text on every call: with Redis Functions the library keeps
-- the lists it read (at most 1000 texts; then it starts again), so a call reads none.
local limit_lists = {}
local limit_list_count = 0
local function limits_of(text)
  local list = limit_lists[text]
  if list then
    return list
  end
  list = {}
  for word in string.gmatch(text, '[^:]+') do
    list[#list + 1] = tonumber(word) or word
  end
  if limit_list_count >= 1000 then
    limit_lists = {}
    limit_list_count = 0
  end
  limit_lists[text] = list
  limit_list_count = limit_list_count + 1
  return list
end

-- The lean check: a check ('c') that every limit admits on its state as the steps would
-- (the common case), decided in the fewest commands and tables by each algorithm's
-- X_try, then written by X_commit (a fixed window counts in its try, and is taken back
-- with period_undo when a later limit does not admit). Returns the engine's reply, or
-- nil when the general engine below decides (a blocked key, a refusal, a skew, a clock
-- step), with nothing changed.
local function lean(KEYS, ARGV, L)
  local cost = tonumber(ARGV[2])
  local n = #KEYS - 1
  if n == 1 then
    -- One limit (L: its letter, its count of arguments, its arguments): the reply made
    -- at once.
    local kind, key, block = L[1], KEYS[1], KEYS[2]
    if kind == 't' then
      local ok, left, full_in, tat, now, tau = token_bucket_try(key, block, L[3], L[4], L[5],
        cost, unix_us(ARGV))
      if not ok then
        return nil
      end
      token_bucket_commit(key, tat, now, tau)
      return { 1, 0, 1, left, 0, full_in }
    end
    if redis.call('PTTL', block) > 0 then
      return nil
    end
    if kind == 'w' then
      local offset, now_us = nil, nil
      if L[2] > 2 then
        offset = L[5]
        now_us = unix_us(ARGV)
      end
      local ok, count, ttl = period_try(key, L[3], L[4], offset, cost, now_us)
      if not ok then
        return nil
      end
      return { 1, 0, 1, count, ttl }
    elseif kind == 'r' then
      local ok, sum, reset, current, dead = rolling_try(key, L[3], L[4], L[5], cost,
        unix_us(ARGV))
      if not ok then
        return nil
      end
      rolling_commit(key, dead, current, cost, L[4], L[5])
      return { 1, 0, 1, sum, 0, reset }
    elseif kind == 'c' then
      -- A calendar window (its boundaries in ARGV[5] to ARGV[8]): a fixed window of the
      -- length of the window holding now, aligned to its end.
      local now_us = unix_us(ARGV)
      local deadline, length = calendar_window(ARGV, 5, math.floor(now_us / 1000))
      local ok, count, ttl = period_try(key, L[3], length, -deadline, cost, now_us)
      if not ok then
        return nil
      end
      return { 1, 0, 1, count, ttl }
    end
    return nil
  end
  -- The block: read with the first limit's key when that limit is a token bucket
  -- (one command for both), first otherwise.
  local block = nil
  if L[1] == 't' or L[1] == 'T' then
    block = KEYS[n + 1]
  elseif redis.call('PTTL', KEYS[n + 1]) > 0 then
    return nil
  end
  local now_us = nil
  -- Where the next calendar window's boundaries are in ARGV.
  local bounds_at = 5
  local out = { 1, 0 }
  -- Several limits (one returned above): what to write (or take back) once every
  -- limit admits (or one does not): per limit, its letter, its try's values and what it
  -- spent.
  local pending = {}
  local at = 1
  for i = 1, n do
    local kind = L[at]
    local argc = L[at + 1]
    local key = KEYS[i]
    local ok, r1, r2, c1, c2, c3
    -- A member that counts requests (its letter in capitals) spends one.
    local cost = cost
    if kind == 'W' or kind == 'C' or kind == 'T' or kind == 'R' then
      kind = string.lower(kind)
      cost = 1
    end
    if kind == 'w' or kind == 'c' then
      -- A fixed window; a calendar window is one aligned to the end of the window
      -- holding now (its boundaries in ARGV, four per calendar member), taken back as a
      -- fixed window.
      local length, offset = L[at + 3], nil
      if kind == 'c' then
        now_us = now_us or unix_us(ARGV)
        local deadline
        deadline, length = calendar_window(ARGV, bounds_at, math.floor(now_us / 1000))
        bounds_at = bounds_at + 4
        offset = -deadline
        kind = 'w'
      elseif argc > 2 then
        offset = L[at + 4]
        now_us = now_us or unix_us(ARGV)
      end
      ok, r1, r2 = period_try(key, L[at + 2], length, offset, cost, now_us)
      if ok then
        out[#out + 1] = 1
        out[#out + 1] = r1
        out[#out + 1] = r2
        c1 = r1
      end
    elseif kind == 't' then
      now_us = now_us or unix_us(ARGV)
      ok, r1, r2, c1, c2, c3 = token_bucket_try(key, i == 1 and block or nil, L[at + 2],
        L[at + 3], L[at + 4], cost, now_us)
      if ok then
        out[#out + 1] = 1
        out[#out + 1] = r1
        out[#out + 1] = 0
        out[#out + 1] = r2
      end
    elseif kind == 'r' then
      now_us = now_us or unix_us(ARGV)
      ok, r1, r2, c1, c2 = rolling_try(key, L[at + 2], L[at + 3], L[at + 4], cost, now_us)
      if ok then
        c3 = at
        out[#out + 1] = 1
        out[#out + 1] = r1
        out[#out + 1] = 0
        out[#out + 1] = r2
      end
    end
    if not ok then
      for j = 1, #pending, 6 do
        if pending[j] == 'w' then
          -- (A window it started, the count the cost: a key that held nothing.)
          local spent = pending[j + 5]
          period_undo(pending[j + 1], spent, pending[j + 2], pending[j + 2] == spent and -1 or 1)
        end
      end
      return nil
    end
    local p = #pending
    pending[p + 1] = kind
    pending[p + 2] = key
    pending[p + 3] = c1
    pending[p + 4] = c2 or false
    pending[p + 5] = c3 or false
    pending[p + 6] = cost
    at = at + 2 + argc
  end
  for j = 1, #pending, 6 do
    local kind = pending[j]
    if kind == 't' then
      token_bucket_commit(pending[j + 1], pending[j + 2], pending[j + 3], pending[j + 4])
    elseif kind == 'r' then
      local a = pending[j + 4]
      rolling_commit(pending[j + 1], pending[j + 3] or nil, pending[j + 2], pending[j + 5],
        L[a + 3], L[a + 4])
    end
  end
  return out
end

