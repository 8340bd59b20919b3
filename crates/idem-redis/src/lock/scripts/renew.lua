-- lock: the watchdog's renewal, by the owner only. KEYS: lock.
-- ARGV: owner id, lease ms. Returns 1 (renewed) or 0 (not the owner).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
