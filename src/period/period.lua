-- Fixed-window counter. KEYS[1]: the key's counter, the only key this script touches.
-- ARGV[1]: quota, ARGV[2]: period (ms), ARGV[3]: cost,
-- ARGV[4]: UTC offset (ms) to align windows to, or absent for windows that start at the
-- first request. The prelude (src/backend/time.rs) defines unix_us() (the time: the
-- server's TIME, or the caller's, appended as the last ARGV), nargs (the count of the
-- arguments above) and caller_time. Large numbers go to Redis through
-- string.format('%d') so that they are never written in exponent notation.
-- Returns {count, ms until the window ends, admitted (1/0)}. A rejected request is not
-- counted. A window's length is the key's expiry, counted by the server; time is read
-- only to align a new window. A step of the server's clock forward ends a window early,
-- a step back keeps the count (a window never lasts more than one period from now).
local quota = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local ttl = redis.call('PTTL', KEYS[1])
-- A window ends at its expiry: a PTTL of 0 is a key expiring this very millisecond
-- (Redis still holds it), which is already the next window.
local fresh = count == 0 or ttl <= 0
if not fresh and ttl > period then
  -- The server clock stepped back (Redis expiries are Unix times): keep the count, but
  -- end the window within one period, not one period plus the step.
  redis.call('PEXPIRE', KEYS[1], string.format('%d', period))
  ttl = period
end
local deadline = nil
if fresh then
  -- A new window, or a counter that lost its expiry (it must not live forever).
  count = 0
  if nargs >= 4 then
    local now = math.floor(unix_us() / 1000)
    deadline = now - ((now + tonumber(ARGV[4])) % period) + period
    ttl = deadline - now
  else
    ttl = period
  end
end
if count + cost > quota then
  return {count, ttl, 0}
end
count = count + cost
if fresh then
  if deadline and not caller_time then
    -- The server's own clock: end exactly on the edge.
    redis.call('SET', KEYS[1], count, 'PXAT', string.format('%d', deadline))
  else
    -- The caller's clock is not the server's: the edge as a time to live.
    redis.call('SET', KEYS[1], count, 'PX', string.format('%d', ttl))
  end
else
  redis.call('INCRBY', KEYS[1], cost)
end
return {count, ttl, 1}
