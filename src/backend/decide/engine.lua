-- The general engine: decides a check against one limit or a set of limits in one
-- round trip, all or nothing, and every other operation. Two sections (placed by
-- src/backend/decide/engine.rs): `locals`, a call's head and limits read into lists
-- (the fast path reads them too), and `general`, the engine, after each algorithm's
-- `general` section (src/period/period.lua, src/token_bucket/token_bucket.lua,
-- src/rolling/rolling.lua), all after the prelude (src/backend/redis/time.rs) that
-- defines unix_us() and caller_time; and `return`, its call. Each algorithm's steps are
-- three functions:
-- X_state reads a limit's key, X_step decides a check on that state (moving it when the
-- check spends), X_save writes what the steps changed. A call reads each key once and
-- writes it at most once, however many checks it decides (coalesced checks, 'm').
-- KEYS: one key per limit, in order, then the key's block (on Redis Cluster, all in one
-- slot: they share the limited key's hash tag).
-- The dialect (checked by tests/dialect.rs): Lua 5.1 and 5.4 alike (Redis and Valkey run
-- 5.1, Dragonfly 5.4): only the functions both have (no math.frexp; unpack through
-- the prelude's unpack_list), every number in a reply or a command an integer (math.floor,
-- string.format; a token bucket's TAT goes as a float only where native_numbers()), every
-- key of a command written KEYS[i] in the call itself (cluster proxies such as Alibaba
-- Cloud's refuse a key held in a variable: the algorithms' functions take KEYS and their
-- key's index k), expiries set by PEXPIRE or PEXPIREAT or
-- SET's PX (Garnet refuses SET's PXAT).
-- ARGV: first the head, one text 'op:count:param':
-- - op: 'c' check: spend when every limit admits; 'p' peek: decide, spend nothing;
--   'f' refund: give the cost back to every limit; 's' settle: the cost is a signed
--   delta, given back when below 0 (as 'f'), spent whatever the limits say when above
--   0 (debt: see each algorithm's X_charge); 'x' reset: forget the key and its block;
--   'h' a check of a priority class: each limit admits when the cost and the units the
--   class leaves to others (the limit's extra number, one per limit) fit, and spends
--   the cost; 'b' block: refuse the key for `cost` ms; 'u' unblock: lift the key's
--   block, keep its counts; 'v' reserve: one token bucket's tokens at the earliest time
--   they fit; 'l' lease: at least the cost of one token bucket's
--   tokens, at most `param`, after giving back the unused tokens of the key's expired
--   lease (their count the first extra number); 'm' several checks of the key at once,
--   their count in place of the cost and their costs the extra numbers, 'M' several
--   that all cost the same, their cost the one extra number; 'k' checks and
--   settlements of several keys at once (`batch`, at the end), 'K' checks of several
--   keys that all cost the same (of one priority class, if any), their text the one
--   extra argument;
-- - count: the cost;
-- - param: the lockout (ms the key is blocked for when a check is refused; 0: none;
--   for 'v': the longest wait in µs; for 'l': the lease's size).
-- Then the limits (one text: per limit its algorithm ('w' fixed window, 't' token
-- bucket, 'r' rolling window, 'c' calendar window: a fixed window whose boundaries the
-- call sends; in capitals, a set's member that counts requests, not cost: 1 for any
-- cost, 0 for a cost of 0, nothing settled), the count of its arguments and the
-- arguments, separated by ':'), four boundaries per calendar window
-- (src/period/calendar.rs), then the extra numbers; with the caller's time, that time
-- last. The number of limits n is #KEYS - 1. (Two texts rather than a word per
-- argument: Redis spends about a microsecond per argument of a call.)
-- Returns {admitted by every limit (1/0), ms the key stays blocked (0: not blocked),
-- then each limit's reply in order}:
-- Reply: admitted, blocked_ms, limits... (src/backend/decide/protocol.rs: Reply)
-- For 'm', one table of every check's reply, as a
-- batch ('k') replies (the count of limits, then each check's: an admit as its limits'
-- admits, packed or wide, see fast.lua). With more than one
-- limit, every limit decides first without spending; only when all of them admit does
-- each one spend what it decided, so a refusal by any
-- limit spends nothing (and the limits that would have admitted reply with their
-- untouched state). A blocked key spends nothing either.
--## locals
-- The call's two texts, each read into a list of its words (numbers as numbers):
-- ARGV[1], the head ('op:count:param': see src/backend/decide/engine.lua; its list holds the
-- count as written too, for commands), and ARGV[2], the limits. A limiter sends the
-- same texts on almost every call: with Redis Functions the library keeps the lists it
-- read (at most 1000 texts of each kind; then it starts again), so a call reads none
-- (by EVALSHA, each call reads its two). A limits' list
-- also holds `marks`: whether a limit is a token bucket or a rolling window, whose key
-- a block marks for as long as it runs (a key that held nothing too: token_bucket_mark,
-- rolling_mark), so that the fast path, which leaves a marked limit to the engine, need
-- not read the block for the set's fixed windows when they start. And `members`, what
-- the fast path reads of each limit, one table per limit, read by constant indexes
-- (each of which costs Redis one operation, where `list[at + i]` costs two):
--  [1] its letter in lower case; [2] where its words start in the list; [3] whether it
--  counts requests (its letter in capitals); [4] the bits of its capacity (a token
--  bucket's burst, its second argument, else its first: 2^(bits-1) <= capacity <
--  2^bits, counted by doubling: math.frexp is not in Lua 5.4) and [5] 2^bits (an
--  integer in Lua 5.4 too, as `2 ^ bits` would not be), for packed replies; [6], [7],
--  [8] its first three arguments ([8] false for a fixed window of two: no offset);
--  [9] below which ms or µs every admit of it packs (see "Packed replies" below: an
--  admit's count is at most the capacity); [10] its packed admit's low bits (its shape
--  * 64 + its bits) and [11] its wide admit's marker; [12] whether a fixed window that
--  starts reads the block (no member is marked).
local texts = { {}, {} }
local text_counts = { 0, 0 }
local function list_of(kind, text)
  local list = nil
  if kind == 1 then
    -- (The client writes the head: its two numbers are read by arithmetic, which
    -- costs Redis less than tonumber().)
    local op, count, param = string.match(text, '^(%a+):(%-?%d+):(%d+)$')
    list = { op, count + 0, param + 0, count }
  else
    list = {}
    for word in string.gmatch(text, '[^:]+') do
      list[#list + 1] = to_number(word) or word
    end
    local members = {}
    local at = 1
    while at <= #list do
      local letter = list[at]
      local kind = string.lower(letter)
      local capacity, bits, power = list[at + (kind == 't' and 3 or 2)], 0, 1
      while power <= capacity do
        bits, power = bits + 1, power * 2
      end
      -- (At least one bit: a packed admit's bits are never 0, which marks a wide one.)
      if bits == 0 then
        bits, power = 1, 2
      end
      local shape = (kind == 'w' or kind == 'c') and 0 or 1
      local third = list[at + 4]
      if list[at + 1] < 3 then
        third = false
      end
      members[#members + 1] = { kind, at, kind ~= letter, bits, power, list[at + 2],
        list[at + 3], third, (70368744177664 - capacity) / power, shape * 64 + bits,
        -shape * 64 - 1, true }
      if kind == 't' or kind == 'r' then
        list.marks = true
      end
      at = at + 2 + list[at + 1]
    end
    for i = 1, #members do
      members[i][12] = not list.marks
    end
    list.members = members
  end
  if text_counts[kind] >= 1000 then
    texts[kind] = {}
    text_counts[kind] = 0
  end
  texts[kind][text] = list
  text_counts[kind] = text_counts[kind] + 1
  return list
end
--## general
local algorithms = {
  w = { state = period_state, step = period_step, save = period_save, refund = period_refund,
    charge = period_charge, mark = period_mark, unmark = period_unmark },
  c = { state = period_state, step = period_step, save = period_save, refund = period_refund,
    charge = period_charge, mark = period_mark, unmark = period_unmark },
  t = { state = token_bucket_state, step = token_bucket_step, save = token_bucket_save,
    refund = token_bucket_refund, charge = token_bucket_charge, mark = token_bucket_mark,
    unmark = token_bucket_unmark },
  r = { state = rolling_state, step = rolling_step, save = rolling_save, refund = rolling_refund,
    charge = rolling_charge, mark = rolling_mark, unmark = rolling_unmark },
}
-- A member that counts requests: the same algorithm.
algorithms.W = algorithms.w
algorithms.C = algorithms.c
algorithms.T = algorithms.t
algorithms.R = algorithms.r
-- The engine: built once per library (Redis Functions), or once per call (EVALSHA).
-- `L`: the limits' words, `H` the head's (list_of); the fast path has been tried.
local function engine(KEYS, ARGV, L, H)
local op = H[1]
-- Coalesced checks of one cost ('M') decide as 'm', their cost read for each.
local shared = op == 'M'
if shared then
  op = 'm'
end
local cost = H[2]
local n = #KEYS - 1
-- The ms the key stays blocked (0: not blocked). A block ending this very millisecond
-- (PTTL 0) is over; a call that may write (all but a peek) deletes it then, since it
-- takes the key's marks off: a step of the server's clock back would otherwise bring
-- the block back on keys the fast path no longer leaves to the engine.
local function block_left()
  local ms = redis.call('PTTL', KEYS[n + 1])
  if ms == 0 and H[1] ~= 'p' then
    redis.call('DEL', KEYS[n + 1])
  end
  return math.max(0, ms)
end
-- The lockout (ms) of a check; a reservation's longest wait (µs); a lease's size.
local param = H[3]
local limits = {}
local at = 1
-- Calendar windows' boundaries: four numbers each, after the limits' text.
local bounds_at = 3
for i = 1, n do
  local argc = L[at + 1]
  local a = {}
  for j = 1, argc do
    a[j] = L[at + 1 + j]
  end
  local letter = L[at]
  if letter == 'c' or letter == 'C' then
    -- A calendar window (src/period/period.lua): where its boundaries are.
    a.argv = ARGV
    a.bounds = bounds_at
    bounds_at = bounds_at + 4
  end
  limits[i] = { algorithms[letter], a,
    letter == 'W' or letter == 'C' or letter == 'T' or letter == 'R' }
  at = at + 2 + argc
end
-- What limit i spends of a request's cost: the cost, or for a member that counts
-- requests, one (none for a cost of 0).
local function units(i, c)
  if limits[i][3] and c > 1 then
    return 1
  end
  return c
end
-- The numbers after the limits' and the boundaries (a lease's unused tokens, coalesced
-- costs, a class's units left to others).
at = bounds_at
-- What each limit keeps back of a check: nothing, or for a priority class's ('h') the
-- units it leaves to others (a check otherwise).
local keeps = {}
for i = 1, n do
  keeps[i] = 0
end
if op == 'h' then
  -- (A batch's item brings its keeps in its head: H[5].)
  local given = H[5]
  for i = 1, n do
    keeps[i] = given and given[i] or tonumber(ARGV[at + i - 1])
  end
  op = 'c'
end
local now_us = unix_us(ARGV)
-- The states a settlement charged: decided on and saved below, read once.
local settled = {}
if op == 'f' or op == 's' or op == 'x' or op == 'b' or op == 'u' then
  -- Refund (give `cost` back), settle (give back, or spend past the limit), reset
  -- (forget the key), block or unblock, then say where each limit stands: a cost of 0,
  -- decided without writing (an unblocked key's marks come off at the end, as when a
  -- block runs out).
  if op == 'b' then
    redis.call('SET', KEYS[n + 1], '1', 'PX', string.format('%d', cost))
  elseif op == 'x' or op == 'u' then
    redis.call('DEL', KEYS[n + 1])
  end
  local at = string.find(KEYS[1], ':{', 1, true)
  if at and (op == 'b' or op == 'x' or op == 'u') then
    -- Heard by every instance's deny cache and leases (src/backend/redis/changes.rs).
    redis.pcall('PUBLISH', string.sub(KEYS[1], 1, at - 1) .. ':changes', KEYS[1])
  end
  for i = 1, n do
    if op == 'f' then
      limits[i][1].refund(KEYS, i, limits[i][2], now_us, units(i, cost))
    elseif op == 's' then
      -- A member that counts requests settles nothing: the request was one.
      if cost < 0 and not limits[i][3] then
        limits[i][1].refund(KEYS, i, limits[i][2], now_us, -cost)
      elseif cost > 0 and not limits[i][3] then
        -- Charged on its state, which the decision below reads and the end saves.
        local s = limits[i][1].state(KEYS, i, limits[i][2], now_us)
        limits[i][1].charge(s, cost)
        settled[i] = s
      end
    elseif op == 'x' then
      redis.call('DEL', KEYS[i])
    end
  end
  op = 'p'
  cost = 0
end
if op == 'l' then
  -- The unused tokens of the key's expired lease go back first.
  local unused = tonumber(ARGV[at])
  if unused > 0 then
    token_bucket_refund(KEYS, 1, limits[1][2], now_us, unused)
  end
end
if op == 'v' or op == 'l' then
  local blocked = block_left()
  if blocked == 0 then
    -- Reserve (one token bucket): the cost at the earliest time it fits, within the
    -- longest wait. Lease: at least the cost, at most the lease size.
    local take = op == 'v' and token_bucket_reserve or token_bucket_lease
    local reply = take(KEYS, 1, limits[1][2], now_us, cost, param)
    local out = { reply[1], 0 }
    for _, v in ipairs(reply) do
      out[#out + 1] = v
    end
    return out
  end
  op = 'p'
end

-- Each limit's state, read once (the first decision reads it), and the key's block (ms
-- it stays blocked): every decision of the call steps on these; they are saved once.
local states = settled
local blocked = nil

-- One decision: whether every limit admits it (1/0) and each limit's reply.
local function decide(op, cost)
  if blocked == nil then
    blocked = block_left()
  end
  if blocked > 0 then
    -- Blocked: nothing is spent; a limit that would refuse the cost says so (the reply's
    -- wait is then the longer of the block's and the limit's own), the others say where
    -- they stand.
    op = 'p'
  end
  local spend = op == 'c'
  local replies = {}
  local admitted = 1
  for i = 1, n do
    if states[i] == nil then
      states[i] = limits[i][1].state(KEYS, i, limits[i][2], now_us)
    end
    replies[i] = limits[i][1].step(states[i], units(i, cost), spend and n == 1, keeps[i])
    if replies[i][1] == 0 then
      admitted = 0
    end
  end
  if spend and n > 1 and admitted == 1 then
    -- Every limit admits: each spends what it decided.
    for i = 1, n do
      limits[i][1].step(states[i], units(i, cost), true, 0)
    end
  elseif (n > 1 and admitted == 0) or blocked > 0 then
    -- Refused (or blocked): a limit that would have admitted says where it stands,
    -- untouched (a cost of 0 spends nothing).
    for i = 1, n do
      if replies[i][1] == 1 then
        replies[i] = limits[i][1].step(states[i], 0, false, 0)
      end
    end
  end
  if blocked > 0 then
    admitted = 0
  elseif spend and admitted == 0 and param > 0 then
    -- Refused: the key is locked out (a lock already running is not extended: this
    -- check was not blocked, so none is; a block key expiring this very millisecond
    -- (PTTL 0) is over and is replaced, which NX would not do).
    redis.call('SET', KEYS[n + 1], '1', 'PX', string.format('%d', param))
    blocked = math.max(0, redis.call('PTTL', KEYS[n + 1]))
  end
  return admitted, replies
end

-- A decision's reply: {admitted, blocked ms, each limit's reply}.
local function reply_of(admitted, replies)
  local out = { admitted, blocked }
  for i = 1, n do
    for _, v in ipairs(replies[i]) do
      out[#out + 1] = v
    end
  end
  return out
end

local out = nil
if op == 'm' then
  -- Coalesced checks of one key, in arrival order: `cost` is their count, their costs
  -- follow the limits' arguments. Each decides as if it were its own call, and its
  -- reply goes in the call's one table as a batch's do (`batch` below: the count of
  -- limits, then each check's: an admit as its limits' admits, packed or wide,
  -- `put_admit` in fast.lua; anything else as its table).
  out = { n }
  local members, pos = L.members, 2
  for j = 1, cost do
    local admitted, replies = decide('c', tonumber(ARGV[shared and at or at + j - 1]))
    local after = admitted == 1 and pos or nil
    for i = 1, n do
      after = after and put_admit(out, after, members[i], replies[i])
    end
    if not after then
      for x = pos, pos + 3 * n do
        out[x] = nil
      end
      out[pos] = reply_of(admitted, replies)
      after = pos + 1
    end
    pos = after
  end
else
  out = reply_of(decide(op, cost))
end
for i = 1, n do
  if states[i] ~= nil then
    limits[i][1].save(KEYS, i, states[i])
  end
end
-- A blocked key's limits are marked (X_mark), since the fast path reads their keys
-- alone: by the call that blocks it (a block, a lockout), and again by any call that
-- writes while it is blocked (a save may write a value without the mark; a check
-- refused for the block writes nothing, and marks only a key that held nothing). The
-- first call that may write after the block has ended takes the marks off (X_unmark).
-- A peek writes nothing (FCALL_RO): a mark it reads is the engine's to take off.
-- (`first`: the op the call asked for, 'M' as 'm'; `op` is 'p' after a settlement.)
local first = shared and 'm' or H[1]
if first == 'h' then
  first = 'c'
end
if first ~= 'p' then
  for i = 1, n do
    local marked = states[i] ~= nil and states[i].marked
    if blocked > 0 then
      if not marked or (first ~= 'c' and first ~= 'm') then
        limits[i][1].mark(KEYS, i, blocked)
      end
    elseif marked then
      limits[i][1].unmark(KEYS, i)
    end
  end
end
return out
end

-- An item's error, as `pcall` caught it, raised again as the server's own error reply
-- unless it is its key's: a stored value of another type (WRONGTYPE), one the script
-- cannot read (ERR, or a Lua error without a code). Any other code (READONLY, OOM,
-- NOPERM, BUSY, ...) and a command refused to this user concern every key, as the
-- caller sorts them (src/backend/redis/fault.rs): the call fails as each item's own
-- call would have, so that the breaker counts it. Redis 7 and later give the reply
-- itself ('READONLY You ...'), Redis 6.2 with a place before it ('=[C]: -1: -READONLY
-- You ...'); raised as an error table on 7 and later (the reply keeps its code), as a
-- '-'-led text before (which 6.2 wraps as 'Error running script ...: -READONLY ...').
local function raise_unless_keys(e)
  if type(e) == 'table' then
    e = e.err
  end
  e = tostring(e)
  local code = string.match(e, '^%-?(%u+) ') or string.match(e, ': %-(%u+) ')
  local refused = string.find(e, "can't run this command", 1, true)
    or string.find(e, 'ACL failure in script', 1, true)
  if not refused and (code == nil or code == 'WRONGTYPE' or code == 'ERR') then
    return
  end
  local reply = code and string.sub(e, (string.find(e, code .. ' ', 1, true))) or e
  if redis.REDIS_VERSION_NUM then
    error(redis.error_reply(reply))
  end
  error('-' .. reply, 0)
end

-- A batch's items from place[1] on (see `batch` below), each reply put in `out` from
-- place[2] on: `place` says, for an item that raises an error, which item it was and
-- where its reply begins.
local function batch_from(KEYS, ARGV, L, H, out, place, n, at, step, now_us)
  local op, text, number, keeps = 'c', nil, 0, nil
  local from, pos = place[1], place[2]
  for j = from, H[2] do
    place[1], place[2] = j, pos
    local k = (j - 1) * (n + 1)
    -- (The one text of 'K' read once.)
    if j == from or step == 1 then
      op, text, keeps = 'c', ARGV[at + 1 + (j - 1) * step], nil
      local first = string.byte(text)
      if first == 115 then
        op, text = 's', string.sub(text, 2)
      elseif first == 104 then
        -- A priority class's check: its cost, then each limit's keep, after ':' each.
        op, keeps = 'h', {}
        for word in string.gmatch(string.sub(text, 2), '[^:]+') do
          keeps[#keeps + 1] = word + 0
        end
        text = string.match(text, '^h(%d+)')
        table.remove(keeps, 1)
      end
      number = text + 0
    end
    local after = nil
    if op == 'c' or op == 'h' then
      after = fast_check(KEYS, ARGV, L, k, n, number, text, now_us, out, pos, keeps)
    else
      local reply = fast_settle(KEYS, ARGV, L, k, n, number, text, now_us)
      if type(reply) == 'number' then
        out[pos] = reply
        after = pos + 1
      elseif reply and reply[1] < 0 then
        -- (A table of admits: in place, as the fast path's.)
        after = pos
        for _, v in ipairs(reply) do
          out[after] = v
          after = after + 1
        end
      elseif reply then
        out[pos] = reply
        after = pos + 1
      end
    end
    if not after then
      -- (What the fast path wrote is taken back: at most three numbers a limit.)
      for x = pos, pos + 3 * n do
        out[x] = nil
      end
      local keys = {}
      for i = 1, n + 1 do
        keys[i] = KEYS[k + i]
      end
      -- (A priority class's check locks nothing out: its lockout is 0.)
      out[pos] = engine(keys, ARGV, L, { op, number, keeps and 0 or H[3], text, keeps })
      after = pos + 1
    end
    pos = after
  end
  place[1] = H[2] + 1
end

-- Checks and settlements of several keys of one limiter in one call ('k',
-- src/backend/decide/batch.rs): the head's count is how many; item j has its n + 1 keys
-- (its limits', then its block) from KEYS[(j - 1) * (n + 1) + 1], and its text is the
-- j-th of the last `count` arguments (before the caller's time): a check's cost, a
-- settlement's delta after an 's' ('s-3'), or a priority class's check ('h'), its cost
-- and then each limit's keep after a ':' each ('h1:40:12'); with 'K', every item's text is the one last
-- argument (checks that cost the same: an argument costs Redis about as much as a
-- key). Each is decided as its own call would decide it: by the fast path (its
-- settlement), else by the engine on its own keys (a refusal, a block, a skew, a
-- set's settlement). The time is read once. Returns one table: n, then each item's
-- reply in order, flat (a table in a table costs Redis about 4 500 instructions to
-- reply): an admit as its n limits' admits, packed or wide (see fast.lua), anything
-- else as its table (the engine's). An item that raises an error of its key (its key
-- holds a value of another type) replies `false` (its check reports it, the failure
-- policy answers it), and the items after it go on: what an item before it wrote is
-- its own. An error that concerns every key (see `raise_unless_keys`) fails the call,
-- as it would have failed each item's own call.
local function batch(KEYS, ARGV, L, H)
  local count = H[2]
  local n = #KEYS / count - 1
  local step = 1
  if H[1] == 'K' then
    step = 0
  end
  local at = #ARGV - 1 - (count - 1) * step
  if caller_time then
    at = at - 1
  end
  local now_us = unix_us(ARGV)
  local out = { n }
  -- (One protected call for the items, another after each that raised an error: a
  -- protected call per item cost Redis about 500 instructions a check.)
  local place = { 1, 2 }
  while place[1] <= count do
    local ok, e = pcall(batch_from, KEYS, ARGV, L, H, out, place, n, at, step, now_us)
    if ok then
      break
    end
    raise_unless_keys(e)
    local pos = place[2]
    for x = pos, pos + 3 * n do
      out[x] = nil
    end
    out[pos] = false
    place[1], place[2] = place[1] + 1, pos + 1
  end
  return out
end
--## return
if H[1] == 'k' or H[1] == 'K' then
  return batch(KEYS, ARGV, L, H)
end
return engine(KEYS, ARGV, L, H)
