-- Fixed window: the lean check (see src/backend/lean.lua), placed before the general
-- steps (src/period/period.lua), whose rules it follows.
-- Takes back what period_try counted (`count`: the count it left; `ttl`: the key's
-- expiry then, -1 for a key that held nothing, which is deleted again).
local function period_undo(key, cost, count, ttl)
  if count == cost and ttl == -1 then
    redis.call('DEL', key)
  else
    redis.call('INCRBY', key, -cost)
  end
end

-- The lean check (src/backend/lean.lua): the common case of the steps (src/period/period.lua) in the
-- fewest commands, deciding exactly as they do. period_try(key, quota, length, offset,
-- cost, now_us) counts the cost at once (INCRBY) and returns true, the count and the ms
-- until the window ends when the key's window admits it as the steps would; else it
-- takes the count back and returns false, and the steps decide (a refusal, a new window
-- over a stale key, a skew, a clock step). A key that held nothing starts its window
-- here, as period_save would.
local function period_try(key, quota, length, offset, cost, now_us)
  local count = redis.pcall('INCRBY', key, cost)
  if type(count) ~= 'number' then
    -- "count skew": the steps decide.
    return false
  end
  local ttl = redis.call('PTTL', key)
  if count == cost and ttl == -1 and cost <= quota then
    -- A new window.
    if not offset then
      redis.call('PEXPIRE', key, length)
      return true, count, length
    end
    local now = math.floor(now_us / 1000)
    local deadline = now - ((now + offset) % length) + length
    if caller_time then
      redis.call('PEXPIRE', key, string.format('%d', deadline - now))
    else
      redis.call('PEXPIREAT', key, string.format('%d', deadline))
    end
    return true, count, deadline - now
  end
  if count ~= cost and ttl > 0 and ttl <= length and count <= quota then
    return true, count, ttl
  end
  period_undo(key, cost, count, ttl)
  return false
end
