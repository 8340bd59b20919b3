-- release. KEYS: record. ARGV: token, how long the released key remembers
-- its token (ms). Returns 1 (released) or 0 (stale).
-- The record becomes a tombstone (state 'r', token only): absent to every
-- reader, but the next acquisition continues from its token.
local r = decode(redis.call('GET', KEYS[1]))
if not owns(r, ARGV[1], now) then
  return 0
end
redis.call('SET', KEYS[1], encode({s = 'r', t = r.t, l = 0, a = 0, b = now}), 'PX', ARGV[2])
return 1
