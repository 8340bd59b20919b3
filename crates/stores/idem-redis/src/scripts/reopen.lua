-- reopen. KEYS: record. ARGV: token, how long the reopened key remembers
-- its token (ms). Returns 1 (reopened) or 0 (stale).
-- A record completed by this token, within its retention, becomes a
-- tombstone as a released claim does: absent to every reader, and the
-- next acquisition continues from its token.
local r = decode(redis.call('GET', KEYS[1]))
if not (r and r.s == 'c' and r.t == tonumber(ARGV[1]) and r.l > now) then
  return 0
end
redis.call('SET', KEYS[1], encode({s = 'r', t = r.t, l = 0, a = 0, b = now}), 'PX', ARGV[2])
return 1
