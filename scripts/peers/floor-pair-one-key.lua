-- The floor of a batch of checks of the atomic pair (a token bucket and a daily fixed
-- window) if the pair kept its two states in one key, a layout the crate does not have
-- (see benches/NOTES.md, "The pair in one key"): per check one GET of the value "TAT count
-- end" (µs, units, the window's end in ms), one SET of it with the later of the two
-- expiries, and the same reply as floor-pair.lua's (the bucket's packed admit, the
-- window's wide one), with the crate's call shape (per check the set's key and its
-- block, declared; the head and the limits' texts). TIME once a call.
-- Written for scripts/bench-cost (BENCH_FLOOR), to measure what that layout would save.
-- KEYS: per check the set's key, then its block. ARGV: the head, the limits (not read).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local now_ms = math.floor(now / 1000)
local out = { 2 }
for i = 1, #KEYS, 2 do
  local value = redis.call('GET', KEYS[i])
  local tat, count, ends = now, 0, now_ms + 86400000
  if value then
    local a, b, c = string.match(value, '^(%d+) (%d+) (%d+)$')
    tat, count, ends = tonumber(a), tonumber(b), tonumber(c)
    if ends <= now_ms then
      count, ends = 0, now_ms + 86400000
    end
  end
  if tat < now then
    tat = now
  end
  tat = tat + 1
  count = count + 1
  redis.call('SET', KEYS[i], string.format('%d %d %d', tat, count, ends), 'PX',
    string.format('%d', ends - now_ms))
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = -(tat - now) - 1, -1, count, ends - now_ms
end
return out
