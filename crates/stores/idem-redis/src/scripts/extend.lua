-- extend. KEYS: record. ARGV: token, lease ms, abandoned retention ms.
-- Returns the new lease expiry, or 0 (stale).
local r = decode(redis.call('GET', KEYS[1]))
if not owns(r, ARGV[1], now) then
  return 0
end
r.l = now + tonumber(ARGV[2])
redis.call('SET', KEYS[1], encode(r), 'PXAT', r.l + ARGV[3] + 1)
return r.l
