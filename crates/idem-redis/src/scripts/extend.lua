-- extend. KEYS: record. ARGV: token, lease ms, abandoned retention ms.
-- Returns the new lease expiry, or 0 (stale).
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'l')
if not owns(r, ARGV[1], now) then
  return 0
end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'l', fmt(lease_until))
redis.call('PEXPIREAT', KEYS[1], fmt(lease_until + tonumber(ARGV[3])))
return fmt(lease_until)
