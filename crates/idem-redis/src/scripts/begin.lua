-- begin, for one or many keys in one call (all in one hash slot on a
-- cluster, all with the same lease). KEYS: the record of each item.
-- ARGV: '1' when Redis takes SET with both NX and GET (7.0 and later);
-- the lease (ms); how long a record lives (ms, as text so Redis need not
-- format it: the lease, the abandoned retention, and 1 so the key never
-- goes before the lease); then each item's fingerprint ('' for none).
-- Returns Redis's time, then for each item: a token (acquired, first
-- attempt) | {'a', token, attempt} (acquired again after a lapsed lease) |
-- {'i', retry_after} | {'c', completed_at, outcome or nothing} | {'m'}.
-- A lease acquired here ends at the returned time plus the lease.
local now = now_ms()
-- The last token the record remembers plus one, but at least the time ×
-- 1024: tokens keep increasing after the record expired or Redis lost its
-- data, as long as the clock moves forward. A key without a record gets
-- the floor.
local floor = now * 1024
local nx_get = ARGV[1] == '1'
local lease_until, life = now + ARGV[2], ARGV[3]
-- A first claim's record, the same for every item but the fingerprint:
-- its header without and with a fingerprint, made when first needed.
local bare, printed
local out = {now}

for i = 1, #KEYS do
  local rec, fp = KEYS[i], ARGV[3 + i]
  local fresh
  if fp == '' then
    bare = bare or struct.pack(HEAD, 'p', 0, lease_until, now, floor, 1)
    fresh = bare
  else
    printed = printed or struct.pack(HEAD, 'p', 1, lease_until, now, floor, 1)
    fresh = printed .. fp
  end
  -- The common case, a key seen for the first time, in one command.
  local old
  if nx_get then
    old = redis.call('SET', rec, fresh, 'NX', 'GET', 'PX', life)
  else
    old = redis.call('GET', rec)
    if not old then
      redis.call('SET', rec, fresh, 'PX', life)
    end
  end
  if not old then
    out[i + 1] = floor
  else
    local r = decode(old)
    if fp == '' then
      fp = nil
    end
    -- Both fingerprints present and different.
    local differs = r.fp and fp and r.fp ~= fp
    local attempt = 1
    local answer = nil
    if r.s == 'p' then
      if r.l <= now then
        attempt = r.a + 1
      elseif differs then
        answer = {'m'}
      else
        answer = {'i', r.l - now}
      end
    elseif r.s == 'c' and r.l > now then
      if differs then
        answer = {'m'}
      else
        answer = {'c', r.b, r.o}
      end
    end
    if not answer then
      -- A lapsed lease, a released key's tombstone, or a completion whose
      -- retention ends this millisecond: acquired, with a greater token.
      local token = math.max(r.t + 1, floor)
      redis.call('SET', rec, encode({s = 'p', t = token, l = lease_until, a = attempt, b = now, fp = fp}),
        'PX', life)
      answer = {'a', token, attempt}
    end
    out[i + 1] = answer
  end
end
return out
