-- A shared key filter's lookup: for one or many keys in one call (all in
-- one hash slot on a cluster). KEYS: the record of each item (for the
-- call's routing only). ARGV: the prefix of the filter's keys in this
-- slot, the window (ms), the generations, the positions per key; then for
-- each item its positions (4 bytes each, little-endian).
-- Returns, for each item, 1 (maybe: every position set in a live
-- generation, or the filter not ready here) or 0 (certainly new).
local prefix, window, gens, k = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
if redis.call('EXISTS', prefix .. 'ready') == 0 then
  for i = 1, #KEYS do
    out[i] = 1
  end
  return out
end
local w = math.floor(now / window)
for i = 1, #KEYS do
  local packed = ARGV[4 + i]
  local maybe = 0
  for g = w - gens + 1, w do
    local gen = prefix .. g
    local all = 1
    for j = 0, k - 1 do
      if redis.call('GETBIT', gen, (struct.unpack('<I4', packed, 4 * j + 1))) == 0 then
        all = 0
        break
      end
    end
    if all == 1 then
      maybe = 1
      break
    end
  end
  out[i] = maybe
end
return out
