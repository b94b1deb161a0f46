-- The floor of a batch of token bucket checks: only the commands the crate's fast path
-- runs for them (TIME once a call; per check GET of its key, then SET ... PX of the new
-- TAT, the numbers written as text) and a reply of one number per check in one table,
-- with the crate's call shape (per check its key and its block, both declared; the
-- head and the limits' texts). Whatever the crate does beyond this is its own Lua.
-- Written for scripts/bench-cost (BENCH_FLOOR).
-- KEYS: per check its key, then its block. ARGV: the head, the limits (not read).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = { 1 }
for i = 1, #KEYS, 2 do
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then
    tat = now
  end
  tat = tat + 1
  redis.call('SET', KEYS[i], string.format('%d', tat), 'PX', string.format('%d', 1000))
  out[#out + 1] = -(tat - now) - 1
end
return out
