-- The handovers listed longer than a while ago (a tiered store's list of
-- completed records on their way to its cold tier), each listed anew as it
-- is answered, so that of several processes sweeping the list one takes
-- it at a time. KEYS: the list (a sorted set: member the record's key,
-- encoded, then its token, 8 bytes big-endian; score when it was listed,
-- ms). ARGV: how long ago (ms), the most to answer.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], now, member)
end
return due
