-- begin, for one or many keys in one call (all in one hash slot on a
-- cluster). KEYS: the record of each item.
-- ARGV: abandoned retention ms; then for each item: fingerprint ('' for
-- none), lease ms.
-- Returns, for each item: {'a', token, lease_expires_at, attempt} |
-- {'i', retry_after} | {'c', completed_at, outcome or nothing} | {'m'}.
local now = now_ms()
local floor = now * 1024
local abandoned = tonumber(ARGV[1])
local out = {}

for i = 1, #KEYS do
  local rec = KEYS[i]
  local fp, lease = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  if fp == '' then
    fp = nil
  end
  local r = decode(redis.call('GET', rec))
  -- Both fingerprints present and different.
  local differs = r and r.fp and fp and r.fp ~= fp
  local attempt = 1
  local answer = nil
  if r and r.s == 'p' then
    if r.l <= now then
      attempt = r.a + 1
    elseif differs then
      answer = {'m'}
    else
      answer = {'i', r.l - now}
    end
  elseif r and r.s == 'c' and r.l > now then
    if differs then
      answer = {'m'}
    else
      answer = {'c', fmt(r.b), r.o}
    end
  end
  if not answer then
    -- The last token the record remembers plus one, but at least the
    -- time × 1024: tokens keep increasing after the record expired or Redis
    -- lost its data, as long as the clock moves forward.
    local token = math.max((r and r.t or 0) + 1, floor)
    local lease_until = now + lease
    redis.call('SET', rec, encode({s = 'p', t = token, l = lease_until, a = attempt, b = now, fp = fp}),
      'PXAT', fmt(lease_until + abandoned))
    answer = {'a', fmt(token), fmt(lease_until), attempt}
  end
  out[i] = answer
end
return out
