-- The engine: decides a check against one limit or a set of limits in one round trip,
-- all or nothing. The algorithms (src/period/period.lua, src/token_bucket/token_bucket.lua,
-- src/rolling/rolling.lua) are functions placed before this text, after the prelude
-- (src/backend/time.rs) that defines unix_us() and caller_time.
-- KEYS: one key per limit, in order (on Redis Cluster, all in one slot).
-- ARGV: op ('c' check: spend when every limit admits; 'p' peek: decide, spend nothing;
-- 'f' refund: give the cost back to every limit; 'x' reset: forget the key), cost,
-- the number of limits n, then per limit its algorithm ('w' fixed window, 't' token
-- bucket, 'r' rolling window), the count of its arguments and the arguments; with the
-- caller's time, that time last.
-- Returns {admitted by every limit (1/0), then each limit's reply in order}. With more
-- than one limit, every limit decides first without writing; only when all of them
-- admit does each one write its own change, so a refusal by any limit spends nothing
-- (and the limits that would have admitted reply with their untouched state).
local algorithms = { w = period, t = token_bucket, r = rolling }
local refunds = { w = period_refund, t = token_bucket_refund, r = rolling_refund }
local op = ARGV[1]
local cost = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local limits = {}
local at = 4
for i = 1, n do
  local argc = tonumber(ARGV[at + 1])
  local a = {}
  for j = 1, argc do
    a[j] = tonumber(ARGV[at + 1 + j])
  end
  limits[i] = { algorithms[ARGV[at]], a, refunds[ARGV[at]] }
  at = at + 2 + argc
end
local now_us = unix_us()
if op == 'f' or op == 'x' then
  -- Refund (give `cost` back) or reset (forget the key), then say where each limit
  -- stands: a cost of 0, decided without writing.
  for i = 1, n do
    if op == 'f' then
      limits[i][3](KEYS[i], limits[i][2], now_us, cost)
    else
      redis.call('DEL', KEYS[i])
    end
  end
  op = 'p'
  cost = 0
end
local spend = op == 'c'
local replies = {}
local admitted = 1
for i = 1, n do
  replies[i] = limits[i][1](KEYS[i], limits[i][2], now_us, cost, spend and n == 1)
  if replies[i][1] == 0 then
    admitted = 0
  end
end
if spend and n > 1 and admitted == 1 then
  for i = 1, n do
    replies[i] = limits[i][1](KEYS[i], limits[i][2], now_us, cost, true)
  end
elseif n > 1 and admitted == 0 then
  -- Refused: a limit that would have admitted says where it stands, untouched (a cost
  -- of 0 spends nothing).
  for i = 1, n do
    if replies[i][1] == 1 then
      replies[i] = limits[i][1](KEYS[i], limits[i][2], now_us, 0, false)
    end
  end
end
local out = { admitted }
for i = 1, n do
  for _, v in ipairs(replies[i]) do
    out[#out + 1] = v
  end
end
return out
