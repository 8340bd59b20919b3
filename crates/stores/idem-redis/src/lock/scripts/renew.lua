-- lock: the watchdog's renewal, by the owner only. KEYS: lock.
-- ARGV: owner id, lease ms. Returns the lease's length as Redis now counts
-- it (ms, at least 1), or 0 (not the owner: nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return math.max(redis.call('PTTL', KEYS[1]), 1)
