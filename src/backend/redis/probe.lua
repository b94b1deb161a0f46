-- The health probe: one write, so a Redis that answers but refuses writes (OOM,
-- READONLY, LOADING) is not taken for healthy.
-- KEYS[1] = the backend's probe key; ARGV[1] = its time to live in milliseconds.
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return {1}
