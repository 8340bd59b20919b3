-- The right to rebuild a shared key filter: taken when free, renewed when
-- held by ARGV[1]. KEYS: the lease. ARGV: the holder, the hold (ms).
-- Returns 1 when ARGV[1] holds it now, 0 otherwise.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
