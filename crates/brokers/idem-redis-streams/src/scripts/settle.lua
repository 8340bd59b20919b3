-- Acks one entry and, only if it was still pending (no other consumer
-- settled it meanwhile), writes its copy in the same atomic step.
-- KEYS[1]: the stream; KEYS[2]: where the copy goes (the stream itself,
--   the dead-letter stream, or the retry set).
-- ARGV: group, entry id, 'now' | 'later', delay in ms, then field, value, ...
-- A copy for later is one member of the retry set, scored with its due time
-- in ms on Redis's clock: the msgpack of {entry id, field, value, ...} (the
-- id keeps two equal copies apart).
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 1 then
  if ARGV[3] == 'later' then
    local t = redis.call('TIME')
    local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
    redis.call('ZADD', KEYS[2], due, cmsgpack.pack({ARGV[2], unpack(ARGV, 5)}))
  else
    redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5))
  end
end
return acked
