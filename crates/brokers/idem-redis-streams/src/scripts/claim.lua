-- Claims entries other consumers left pending longer than the idle time,
-- with the group's delivery counter of each (XAUTOCLAIM does not answer it).
-- KEYS[1]: the stream. ARGV: group, consumer, min idle ms, cursor, count.
-- Answers {next cursor, {{id, fields, deliveries}, ...}}.
local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
for _, entry in ipairs(claimed[2]) do
  -- Before Redis 7, a deleted entry is claimed with nil fields: skip it.
  if entry[2] then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], entry[1], entry[1], 1)
    local deliveries = 1
    if #p > 0 then
      deliveries = p[1][4]
    end
    out[#out + 1] = {entry[1], entry[2], deliveries}
  end
end
return {claimed[1], out}
