-- complete. KEYS: record, token counter.
-- ARGV: token, retention ms, '1' when an outcome follows, outcome,
-- counter ttl ms. Returns 1 (done) or 0 (stale).
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'l')
if not owns(r, ARGV[1], now) then
  return 0
end
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 's', 'c', 'l', fmt(expires), 'b', fmt(now))
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'o', ARGV[4])
end
redis.call('PEXPIREAT', KEYS[1], fmt(expires))
-- The counter outlives the record it numbers.
redis.call('PEXPIRE', KEYS[2], fmt(tonumber(ARGV[2]) + tonumber(ARGV[5])))
return 1
