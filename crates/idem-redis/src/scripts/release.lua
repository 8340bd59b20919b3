-- release. KEYS: record. ARGV: token, how long the released key remembers
-- its token (ms). Returns 1 (released) or 0 (stale).
-- The record becomes a tombstone (state 'r', token only): absent to every
-- reader, but the next acquisition within the time continues from its token.
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'l')
if not owns(r, ARGV[1], now) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'r', 't', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
