-- complete, for one or many keys in one call (all in one hash slot on a
-- cluster, all with the same retention). KEYS: record, for each item.
-- ARGV: the retention (ms); how long the key lives (ms, as text: the
-- retention plus 1, never less); one character per item, '1' when the item
-- has an outcome; then for each item: its token (8 bytes, little-endian),
-- its outcome ('' for none).
-- Returns, for one key, 1 (done, or done before by this token) or 0
-- (stale); for many, that for each.
local life, has_outcome = ARGV[2], ARGV[3]
-- Retention end and completion time, the same for every item.
local times = struct.pack('<i8i8', now + ARGV[1], now)

-- Completes item `i`, whose record is `v`, if its token owns it.
local function finish(i, v)
  if not v then
    return 0
  end
  -- State, flags, lease or retention end, and the token's bytes.
  local s, flags, lease_end, _, token = struct.unpack('<c1Bi8i8c8', v)
  if token ~= ARGV[2 + 2 * i] or lease_end <= now then
    return 0
  end
  -- Completed by this same token: a retry whose first answer was lost.
  -- Done, and nothing changes.
  if s == 'c' then
    return 1
  end
  -- Owned: in progress under this token, lease still live.
  if s ~= 'p' then
    return 0
  end
  flags = flags % 2
  -- Token, attempts and fingerprint stay as they are.
  local kept = string.sub(v, 19, flags == 1 and 46 or 30)
  -- PSETEX: SET … PX, without options to parse.
  if string.byte(has_outcome, i) == 49 then
    redis.call('PSETEX', KEYS[i], life, 'c' .. string.char(flags + 2) .. times .. kept .. ARGV[3 + 2 * i])
  else
    redis.call('PSETEX', KEYS[i], life, 'c' .. string.char(flags) .. times .. kept)
  end
  return 1
end

if #KEYS == 1 then
  return finish(1, redis.call('GET', KEYS[1]))
end
-- One MGET for many keys costs less than a GET each.
local values = redis.call('MGET', unpack(KEYS))
local out = {}
-- A key met again in this call is read again: its first item may have
-- completed it.
local seen = {}
for i = 1, #KEYS do
  local k, v = KEYS[i], values[i]
  if seen[k] then
    v = redis.call('GET', k)
  end
  out[i] = finish(i, v)
  seen[k] = true
end
return out
