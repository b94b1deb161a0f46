-- GCRA as go-redis/redis_rate runs it: the arrival time in seconds since an epoch, a
-- float; SET with EX while the bucket is not full. Written for the benchmarks
-- (benches/bench_engine.rs, scripts/bench-cost) from the published algorithm.
-- KEYS[1]: the key; ARGV: burst, rate, period (s), cost.
redis.replicate_commands()
local key = KEYS[1]
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interval = period / rate
local increment = interval * cost
local offset = interval * burst
local t = redis.call('TIME')
local now = (t[1] - 1483228800) + t[2] / 1000000
local tat = redis.call('GET', key)
if not tat then tat = now else tat = tonumber(tat) end
tat = math.max(tat, now)
local new_tat = tat + increment
local diff = now - (new_tat - offset)
local remaining = diff / interval
if remaining < 0 then
  return {0, 0, tostring(-diff), tostring(tat - now)}
end
local reset = new_tat - now
if reset > 0 then
  redis.call('SET', key, new_tat, 'EX', math.ceil(reset))
end
return {cost, remaining, tostring(-1), tostring(reset)}
