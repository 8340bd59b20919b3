-- complete, for one or many keys in one call (all in one hash slot on a
-- cluster). KEYS: record, for each item. ARGV, for each item: token,
-- retention ms, '1' when an outcome follows, outcome.
-- Returns, for each item, 1 (done) or 0 (stale).
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  local rec = KEYS[i]
  local r = decode(redis.call('GET', rec))
  if owns(r, ARGV[4 * i - 3], now) then
    r.s = 'c'
    r.l = now + tonumber(ARGV[4 * i - 2])
    r.b = now
    if ARGV[4 * i - 1] == '1' then
      r.o = ARGV[4 * i]
    end
    redis.call('SET', rec, encode(r), 'PXAT', fmt(r.l))
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
