-- begin, part one: the common case (`begin.lua` is the rest, and
-- `record.lua` goes between them, so a first claim does not pay for
-- reading records). For one or many keys in one call (all in one hash
-- slot on a cluster, all with the same lease). KEYS: the record of each
-- item.
-- ARGV: '1' when Redis takes SET with both NX and GET (7.0 and later);
-- the lease (ms); how long a record lives (ms, as text so Redis need not
-- format it: the lease, the abandoned retention, and 1 so the key never
-- goes before the lease); then each item's fingerprint ('' for none).
-- Returns, for one key claimed for the first time, its token alone (the
-- time × 1024: Redis's time is the token / 1024). Otherwise Redis's time,
-- then for each item: a token (acquired, first attempt) | {'a', token,
-- attempt} (acquired again after a lapsed lease) | {'i', retry_after} |
-- {'c', completed_at, outcome or nothing} | {'m'}.
-- A lease acquired here ends at Redis's time plus the lease.
-- The last token the record remembers plus one, but at least the time ×
-- 1024: tokens keep increasing after the record expired or Redis lost its
-- data, as long as the clock moves forward. A key without a record gets
-- the floor.
local floor = now * 1024
local lease_until, life = now + ARGV[2], ARGV[3]
-- A first claim's record (the layout of `record.lua`): state 'p', flags,
-- then `fresh` (lease end, start, token, attempt 1), then the fingerprint
-- if any. The same for every item but the fingerprint: `bare` without one,
-- `printed` before it; each made when first needed.
local fresh = struct.pack('<i8i8i8i4', lease_until, now, floor, 1)
local bare, printed

-- Claims `rec` if it has no record; returns the record it has otherwise.
local function claim(rec, fp)
  local new
  if fp == '' then
    bare = bare or 'p\0' .. fresh
    new = bare
  else
    printed = printed or 'p\1' .. fresh
    new = printed .. fp
  end
  if ARGV[1] == '1' then
    return redis.call('SET', rec, new, 'NX', 'GET', 'PX', life)
  end
  local old = redis.call('GET', rec)
  if not old then
    redis.call('SET', rec, new, 'PX', life)
  end
  return old
end

-- The common case, one key seen for the first time, answered alone.
local first
if #KEYS == 1 then
  first = claim(KEYS[1], ARGV[4])
  if not first then
    return floor
  end
end
