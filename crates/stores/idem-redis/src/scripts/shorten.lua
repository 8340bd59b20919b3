-- shorten: keeps completed records at most a while past their completion
-- (a tiered store's hot copy, once the cold tier holds the record). For
-- one or many keys in one call (all in one hash slot on a cluster). KEYS:
-- the record of each item. ARGV: how long past its completion a record is
-- kept (ms); then for each item the token that completed it (8 bytes,
-- little-endian). A record of another token, in progress, or gone is left
-- alone. Returns, for each item, 1 (shortened) or 0 (left alone).
local keep = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local rec = KEYS[i]
  local v = redis.call('GET', rec)
  out[i] = 0
  if v and #v >= 30 then
    -- State, flags, retention end, completion time, the token's bytes.
    local s, flags, ends, since, token = struct.unpack('<c1Bi8i8c8', v)
    local until_ = since + keep
    if s == 'c' and token == ARGV[1 + i] and until_ < ends then
      if until_ <= now then
        redis.call('DEL', rec)
      else
        -- The key goes 1 ms after the retention ends, as `complete` keeps it.
        redis.call('SET', rec, 'c' .. string.char(flags) .. struct.pack('<i8', until_) .. string.sub(v, 11),
          'PXAT', until_ + 1)
      end
      out[i] = 1
    end
  end
end
return out
