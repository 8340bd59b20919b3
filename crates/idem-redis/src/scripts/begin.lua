-- begin, for one or many keys in one call (all in one hash slot on a
-- cluster). KEYS: the record of each item.
-- ARGV: abandoned retention ms; then for each item: fingerprint ('' for
-- none), lease ms.
-- Returns, for each item: {'a', token, lease_expires_at, attempt} |
-- {'i', retry_after} | {'c', completed_at, outcome or nil} | {'m'}.
local now = now_ms()
local now_text = fmt(now)
local floor = now * 1024
local abandoned = tonumber(ARGV[1])
local out = {}

-- Both fingerprints present and different.
local function differs(stored, fp)
  return stored and stored ~= '' and fp ~= '' and stored ~= fp
end

for i = 1, #KEYS do
  local rec = KEYS[i]
  local fp, lease = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local r = redis.call('HMGET', rec, 's', 't', 'f', 'l', 'a', 'b', 'o')
  local attempt = 1
  local answer = nil
  if r[1] == 'p' then
    local until_ = tonumber(r[4])
    if until_ <= now then
      attempt = tonumber(r[5]) + 1
    elseif differs(r[3], fp) then
      answer = {'m'}
    else
      answer = {'i', until_ - now}
    end
  elseif r[1] == 'c' and tonumber(r[4]) > now then
    if differs(r[3], fp) then
      answer = {'m'}
    else
      answer = {'c', r[6], r[7]}
    end
  end
  if not answer then
    -- The last token the record remembers plus one, but at least the
    -- time × 1024: tokens keep increasing after the record expired or Redis
    -- lost its data, as long as the clock moves forward.
    local tok = fmt(math.max(tonumber(r[2] or 0) + 1, floor))
    local lease_until = fmt(now + lease)
    if r[7] then
      redis.call('HDEL', rec, 'o')
    end
    redis.call('HSET', rec, 's', 'p', 't', tok, 'l', lease_until, 'a', attempt, 'b', now_text,
      'f', fp)
    redis.call('PEXPIREAT', rec, now + lease + abandoned)
    answer = {'a', tok, lease_until, attempt}
  end
  out[i] = answer
end
return out
