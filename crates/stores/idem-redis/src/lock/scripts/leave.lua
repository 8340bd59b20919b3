-- lock: a waiter leaves the line (it gave up, or its call was dropped),
-- and lets go of the lock if a call of its own, whose answer nobody heard,
-- took it. KEYS: lock, queue, queue deadlines, wake-list prefix.
-- ARGV: waiter id.
local lock, q, qd, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me = ARGV[1]
redis.call('LREM', q, 0, me)
redis.call('HDEL', qd, me)
redis.call('DEL', wake .. me)
if redis.call('GET', lock) == me then
  redis.call('DEL', lock)
end
-- A free lock: the first in line need not wait for its next look.
if redis.call('EXISTS', lock) == 0 then
  local head = redis.call('LINDEX', q, 0)
  if head then
    redis.call('RPUSH', wake .. head, '1')
    redis.call('PEXPIRE', wake .. head, 60000)
  end
end
return 1
