-- Moves the retry set's due copies back into the stream: each XADD and its
-- ZREM in one step, so two consumers never both move one copy.
-- KEYS[1]: the retry set; KEYS[2]: the stream. ARGV[1]: most copies to move.
-- Answers {copies moved, ms until the next one is due (-1: none left)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local copy = cmsgpack.unpack(member)
  redis.call('XADD', KEYS[2], '*', unpack(copy, 2))
  redis.call('ZREM', KEYS[1], member)
end
local next = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #next == 0 then
  return {#due, -1}
end
return {#due, math.max(0, tonumber(next[2]) - now)}
