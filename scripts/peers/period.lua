-- A fixed window as go-zero's PeriodLimit runs it: INCRBY, EXPIRE on the first unit.
-- Written for the benchmarks (benches/bench_engine.rs, scripts/bench-cost) from the
-- published algorithm. KEYS[1]: the key; ARGV: the quota, the window (s).
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local current = redis.call('INCRBY', KEYS[1], 1)
if current == 1 then
  redis.call('EXPIRE', KEYS[1], window)
end
if current < limit then
  return 1
elseif current == limit then
  return 2
else
  return 0
end
