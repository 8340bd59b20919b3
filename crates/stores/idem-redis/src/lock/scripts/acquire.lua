-- lock: acquire, or take or keep a place in the queue. KEYS: lock, token
-- counter, queue (list of waiter ids, first come first), queue deadlines
-- (hash id -> ms). ARGV: owner id, lease ms, how long the caller's place
-- holds unless it looks again (ms). Every number is checked before the
-- first write, so no write below can fail half-way.
-- Returns {1, token} when acquired, {0, ms left on the holder's lease}.
local lock, ctr, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, lease, hold = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- Numbers Redis could not take as expiries are refused before any write.
if not (lease >= 1 and lease < 2^45 and hold >= 1 and hold < 2^45) then
  return redis.error_reply('lock lease or place in line out of range')
end

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
-- Join the back of the line once; each later look renews the place.
if redis.call('HSET', qd, me, now + hold) == 1 then
  redis.call('RPUSH', q, me)
end
-- The line outlives every place in it; a waiter only ever lengthens its
-- life, never shortens what an earlier one set.
local keep = hold + lease + 60000
for _, k in ipairs({q, qd}) do
  if redis.call('PTTL', k) < keep then
    redis.call('PEXPIRE', k, keep)
  end
end
return {0, math.max(redis.call('PTTL', lock), 0)}
