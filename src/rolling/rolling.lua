-- Rolling window of time buckets. KEYS[1]: the key's hash, the only key this script
-- touches, one field per bucket: the absolute bucket index floor(now_ms / interval) in
-- decimal, holding that bucket's count.
-- ARGV[1]: limit, ARGV[2]: buckets, ARGV[3]: interval (ms), ARGV[4]: cost. The prelude
-- (src/backend/time.rs) defines unix_us() (the time: the server's TIME, or the
-- caller's, appended as the last ARGV) and caller_time.
-- A bucket is live while its index is above current - buckets; bucket i stops counting at
-- (i + buckets) * interval ms. Dead fields are deleted on every call, so the hash holds at
-- most `buckets` fields. Large numbers go to Redis through string.format('%d') so that
-- they are never written in exponent notation.
-- Returns {admitted (1/0), sum of the live buckets after the call, ms until this cost
-- could be admitted (0 when admitted), ms until every counted unit has expired}.
-- A rejected request is not counted. With the server's time, every instance agrees on
-- bucket edges.
local limit = tonumber(ARGV[1])
local buckets = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now = math.floor(unix_us() / 1000)
local current = math.floor(now / interval)
-- Clock steps: the key's own time never goes back. When the server clock has stepped
-- back (a field newer than `current`), every bucket is moved back by the step, keeping
-- its count and its age, as if no time had passed: a step back never frees a unit, and
-- never blocks the key longer than the window. A step forward expires buckets early.
-- With the callers' clocks, a field newer than `current` is written by a caller whose
-- clock is ahead: this caller counts from that bucket instead (moving the buckets back
-- would age them once per such caller, without bound), so no unit ever expires before
-- the clock furthest ahead says so.
local newest = nil
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local index = tonumber(fields[i])
  local count = tonumber(fields[i + 1])
  if index and count and count > 0 and count == math.floor(count)
      and index == math.floor(index) and (newest == nil or index > newest) then
    newest = index
  end
end
local shift = 0
if newest and newest > current then
  if caller_time then
    current = newest
  else
    shift = newest - current
  end
end
local oldest = current - buckets + 1

local live = {}
local indices = {}
local dead = {}
local sum = 0
for i = 1, #fields, 2 do
  local index = tonumber(fields[i])
  local count = tonumber(fields[i + 1])
  if index and count and count > 0 and count == math.floor(count)
      and index == math.floor(index) and index - shift >= oldest then
    index = index - shift
    sum = sum + count
    if not live[index] then
      live[index] = 0
      indices[#indices + 1] = index
    end
    live[index] = live[index] + count
  else
    dead[#dead + 1] = fields[i]
  end
end
if shift > 0 then
  -- Rewrite the moved buckets (whatever the request's outcome).
  redis.call('DEL', KEYS[1])
  for _, index in ipairs(indices) do
    redis.call('HSET', KEYS[1], string.format('%d', index), string.format('%d', live[index]))
  end
  if #indices > 0 then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', (buckets + 1) * interval))
  end
else
  -- Delete in chunks: unpack() has a bounded stack.
  for i = 1, #dead, 500 do
    redis.call('HDEL', KEYS[1], unpack(dead, i, math.min(i + 499, #dead)))
  end
end
table.sort(indices)

if sum + cost <= limit then
  redis.call('HINCRBY', KEYS[1], string.format('%d', current), cost)
  redis.call('PEXPIRE', KEYS[1], string.format('%d', (buckets + 1) * interval))
  sum = sum + cost
  return {1, sum, 0, (current + buckets) * interval - now}
end

-- Rejected: the oldest buckets expire first; find the one whose expiry frees enough.
local need = sum + cost - limit
local freed = 0
local retry = 0
for _, index in ipairs(indices) do
  freed = freed + live[index]
  if freed >= need then
    retry = (index + buckets) * interval - now
    break
  end
end
local reset = 0
if #indices > 0 then
  reset = (indices[#indices] + buckets) * interval - now
end
return {0, sum, retry, reset}
