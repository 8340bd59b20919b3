-- lock: release by the owner only, and wake the first waiter.
-- KEYS: lock, queue, wake-list prefix. ARGV: owner id.
-- Returns 1 (released) or 0 (not the owner: nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local head = redis.call('LINDEX', KEYS[2], 0)
if head then
  local wake = KEYS[3] .. head
  redis.call('RPUSH', wake, '1')
  redis.call('PEXPIRE', wake, 60000)
end
return 1
