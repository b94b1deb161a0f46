-- The floor of a batch of checks of the atomic pair (a token bucket and a daily fixed
-- window, each limit its own key): only the commands the crate's fast path runs for
-- them (TIME once a call; per check the bucket's GET, the window's INCRBY (the cost as
-- text) and PTTL (its end), PEXPIRE when the window starts, the bucket's SET ... PX)
-- and a reply of four numbers per check in one table (the bucket's packed admit, the
-- window's wide one: marker, count, ms left), with the crate's call shape (per check
-- its two keys and its block, declared; the head and the limits' texts).
-- Written for scripts/bench-cost (BENCH_FLOOR).
-- KEYS: per check the bucket's key, the window's, the block. ARGV: the head, the limits
-- (not read).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = { 2 }
for i = 1, #KEYS, 3 do
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  local count = redis.call('INCRBY', KEYS[i + 1], '1')
  local ttl = redis.call('PTTL', KEYS[i + 1])
  if ttl == -1 then
    redis.call('PEXPIRE', KEYS[i + 1], '86400000')
    ttl = 86400000
  end
  if tat < now then
    tat = now
  end
  tat = tat + 1
  redis.call('SET', KEYS[i], string.format('%d', tat), 'PX', string.format('%d', 1000))
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = -(tat - now) - 1, -1, count, ttl
end
return out
