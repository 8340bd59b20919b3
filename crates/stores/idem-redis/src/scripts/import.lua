-- import: completed records another store held, each with its own token
-- and times (docs/contract.md §2, "Tiers"). For one or many keys in one
-- call (all in one hash slot on a cluster). KEYS: the record of each item.
-- ARGV, for each item: the record as `complete` leaves it (the layout of
-- `record.lua`, packed by the caller), when its retention ends (ms), and
-- when its key goes (the end plus 1, as `complete` keeps it).
-- Returns, for each item, 1 (written) or 0 (kept: a live completed record
-- stays, whatever its token, and an expired import is not written).
-- A record in progress, a released key's tombstone, or a completion whose
-- retention has ended is replaced: the holder's token no longer owns it.
local out = {}
for i = 1, #KEYS do
  local rec = KEYS[i]
  local kept = tonumber(ARGV[3 * i - 1]) <= now
  if not kept then
    local old = redis.call('GET', rec)
    if old then
      local s, _, ends = struct.unpack('<c1Bi8', old)
      kept = s == 'c' and ends > now
    end
  end
  if kept then
    out[i] = 0
  else
    redis.call('SET', rec, ARGV[3 * i - 2], 'PXAT', ARGV[3 * i])
    out[i] = 1
  end
end
return out
