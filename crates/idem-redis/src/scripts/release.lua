-- release. KEYS: record. ARGV: token. Returns 1 (released) or 0 (stale).
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'l')
if not owns(r, ARGV[1], now) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
