-- In-flight slots: one sorted set per limited key, whose members are the slots held
-- (16-byte ids: the holding instance, then a counter) and whose scores are the slots'
-- lease expiries in milliseconds of the script's clock (`unix_us`). A slot not renewed
-- before its expiry is gone at the next call on its key: no sweeper.
--
-- KEYS[1] = the key's set.
-- ARGV[1] = the operation: 'a' acquire, 'r' release, 'n' renew, 'p' peek;
-- ARGV[2] = the slots of the limit; ARGV[3] = the lease in milliseconds;
-- ARGV[4..] = slot ids (acquire, release: one; renew: every slot this instance holds on
-- the key); then, with the caller's clock, its time.
-- Reply: {admitted (1) or refused (0), slots held after the call}; a renewal's is {1, 0}
-- (nobody reads it: it counts nothing, to cost Redis less than an acquire).
-- The set lives as long as its longest lease, and up to one lease more: its expiry is
-- set to two leases whenever less than one is left, so most calls only read it.
local function engine(KEYS, ARGV)
  local op = ARGV[1]
  local slots = tonumber(ARGV[2])
  local lease = tonumber(ARGV[3])
  local now = math.floor(unix_us(ARGV) / 1000)
  local last = #ARGV
  if caller_time then
    last = last - 1
  end
  -- Leases that ran out: their holders died (or lost Redis for a whole lease).
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if op == 'a' then
    local held = redis.call('ZCARD', KEYS[1])
    if held >= slots then
      return {0, held}
    end
    redis.call('ZADD', KEYS[1], now + lease, ARGV[4])
    if redis.call('PTTL', KEYS[1]) < lease then
      redis.call('PEXPIRE', KEYS[1], 2 * lease)
    end
    return {1, held + 1}
  elseif op == 'r' then
    redis.call('ZREM', KEYS[1], ARGV[4])
    return {1, redis.call('ZCARD', KEYS[1])}
  elseif op == 'n' then
    -- Only slots still held are renewed (XX): a lease that ran out stays given back.
    -- (One slot, the common case, without a table.)
    if last == 4 then
      redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[4])
    elseif last > 4 then
      local members = {}
      for i = 4, last do
        members[#members + 1] = now + lease
        members[#members + 1] = ARGV[i]
      end
      redis.call('ZADD', KEYS[1], 'XX', unpack_list(members))
    end
    -- (PTTL: -2 for a set that is gone, which stays gone.)
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl ~= -2 and ttl < lease then
      redis.call('PEXPIRE', KEYS[1], 2 * lease)
    end
    return {1, 0}
  end
  return {1, redis.call('ZCARD', KEYS[1])}
end
