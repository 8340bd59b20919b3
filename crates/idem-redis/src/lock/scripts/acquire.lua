-- lock: acquire, or join the queue. KEYS: lock, token counter, queue (list
-- of waiter ids, first come first), queue deadlines (hash id -> ms).
-- ARGV: owner id, lease ms, how long the caller will wait (ms).
-- Returns {1, token} when acquired, {0, ms left on the holder's lease}.
local lock, ctr, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, lease, wait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- Waiters that gave up or died leave the head of the queue.
while true do
  local head = redis.call('LINDEX', q, 0)
  if not head then break end
  local deadline = tonumber(redis.call('HGET', qd, head) or 0)
  if deadline > now then break end
  redis.call('LPOP', q)
  redis.call('HDEL', qd, head)
end

local head = redis.call('LINDEX', q, 0)
local free = redis.call('EXISTS', lock) == 0
if free and (not head or head == me) then
  if head == me then
    redis.call('LPOP', q)
    redis.call('HDEL', qd, me)
  end
  redis.call('SET', lock, me, 'PX', lease)
  local token = math.max(tonumber(redis.call('GET', ctr) or 0) + 1, now * 1024)
  redis.call('SET', ctr, token, 'PX', 86400000)
  return {1, token}
end
-- Wait in line (once), until the caller's own deadline.
if redis.call('HSETNX', qd, me, now + wait + 1000) == 1 then
  redis.call('RPUSH', q, me)
end
redis.call('PEXPIRE', q, wait + lease + 60000)
redis.call('PEXPIRE', qd, wait + lease + 60000)
return {0, math.max(redis.call('PTTL', lock), 0)}
