-- begin. KEYS: record, token counter.
-- ARGV: fingerprint ('' for none), lease ms, abandoned retention ms,
-- counter ttl ms.
-- Returns {'a', token, lease_expires_at, attempt} | {'i', retry_after} |
-- {'c', completed_at, outcome or nil} | {'m'}.
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'f', 'l', 'a', 'b', 'o')
local fp = ARGV[1]
local function differs(stored)
  return stored and fp ~= '' and stored ~= fp
end
local attempt = 1
if r[1] == 'p' then
  local lease = tonumber(r[4])
  if lease <= now then
    attempt = tonumber(r[5]) + 1
  elseif differs(r[3]) then
    return {'m'}
  else
    return {'i', fmt(lease - now)}
  end
elseif r[1] == 'c' and tonumber(r[4]) > now then
  if differs(r[3]) then
    return {'m'}
  end
  return {'c', r[6], r[7]}
end
-- A per-key counter with a floor of the time: tokens keep increasing even
-- after the counter expired or Redis lost its data, as long as the clock
-- moves forward.
local token = redis.call('INCR', KEYS[2])
local floor = now * 1024
if token < floor then
  token = floor
  redis.call('SET', KEYS[2], fmt(token))
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local lease_until = now + tonumber(ARGV[2])
local tok = fmt(token)
redis.call('DEL', KEYS[1])
if fp ~= '' then
  redis.call('HSET', KEYS[1], 's', 'p', 't', tok, 'l', fmt(lease_until), 'a', attempt, 'b', fmt(now), 'f', fp)
else
  redis.call('HSET', KEYS[1], 's', 'p', 't', tok, 'l', fmt(lease_until), 'a', attempt, 'b', fmt(now))
end
redis.call('PEXPIREAT', KEYS[1], fmt(lease_until + tonumber(ARGV[3])))
return {'a', tok, fmt(lease_until), attempt}
