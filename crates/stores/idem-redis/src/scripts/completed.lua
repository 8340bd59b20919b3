-- Which keys hold a live completed record (`record.lua`'s layout: state
-- 'c', retention end after now). KEYS: record keys, all in one hash slot
-- on a cluster. Returns 1 or 0 for each.
-- MGET answers nil for a key that is not a string, so a stranger's key
-- that happens to match idem's pattern reads as no record.
local values = redis.call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local v = values[i]
  local live = 0
  if v and #v >= 30 and string.sub(v, 1, 1) == 'c' then
    local _, _, ends = struct.unpack('<c1Bi8', v)
    if ends > now then
      live = 1
    end
  end
  out[i] = live
end
return out
