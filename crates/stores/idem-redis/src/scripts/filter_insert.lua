-- A shared key filter's insert, into the generation receiving keys now
-- (window number: Redis's time / the window), kept until `gens` windows
-- after its own began. KEYS and ARGV as `filter_check.lua`. Returns 1 for
-- each item.
local prefix, window, gens, k = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local w = math.floor(now / window)
local gen = prefix .. w
local out = {}
for i = 1, #KEYS do
  out[i] = 1
  local packed = ARGV[4 + i]
  for j = 0, k - 1 do
    redis.call('SETBIT', gen, (struct.unpack('<I4', packed, 4 * j + 1)), 1)
  end
end
redis.call('PEXPIREAT', gen, (w + gens) * window)
return out
