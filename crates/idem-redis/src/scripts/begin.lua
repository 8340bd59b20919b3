-- begin, for one or many keys in one call (all in one hash slot on a
-- cluster). KEYS: record, token counter; for each item.
-- ARGV: abandoned retention ms, counter ttl ms; then for each item:
-- fingerprint ('' for none), lease ms.
-- Returns, for each item: {'a', token, lease_expires_at, attempt} |
-- {'i', retry_after} | {'c', completed_at, outcome or nil} | {'m'}.
local now = now_ms()
local abandoned = tonumber(ARGV[1])
local counter_ttl = ARGV[2]
local out = {}
for i = 1, #KEYS / 2 do
  local rec, ctr = KEYS[2 * i - 1], KEYS[2 * i]
  local fp, lease = ARGV[2 * i + 1], tonumber(ARGV[2 * i + 2])
  local r = redis.call('HMGET', rec, 's', 't', 'f', 'l', 'a', 'b', 'o')
  local function differs(stored)
    return stored and stored ~= '' and fp ~= '' and stored ~= fp
  end
  local attempt = 1
  local answer = nil
  if r[1] == 'p' then
    local until_ = tonumber(r[4])
    if until_ <= now then
      attempt = tonumber(r[5]) + 1
    elseif differs(r[3]) then
      answer = {'m'}
    else
      answer = {'i', fmt(until_ - now)}
    end
  elseif r[1] == 'c' and tonumber(r[4]) > now then
    if differs(r[3]) then
      answer = {'m'}
    else
      answer = {'c', r[6], r[7]}
    end
  end
  if not answer then
    -- A per-key counter with a floor of the time: tokens keep increasing
    -- after the counter expired or Redis lost its data, as long as the
    -- clock moves forward.
    local last = tonumber(redis.call('GET', ctr) or 0)
    local token = math.max(last + 1, now * 1024)
    local tok = fmt(token)
    redis.call('SET', ctr, tok, 'PX', counter_ttl)
    local lease_until = now + lease
    if r[7] then
      redis.call('HDEL', rec, 'o')
    end
    redis.call('HSET', rec, 's', 'p', 't', tok, 'l', fmt(lease_until), 'a', attempt, 'b', fmt(now),
      'f', fp)
    redis.call('PEXPIREAT', rec, fmt(lease_until + abandoned))
    answer = {'a', tok, fmt(lease_until), attempt}
  end
  out[i] = answer
end
return out
