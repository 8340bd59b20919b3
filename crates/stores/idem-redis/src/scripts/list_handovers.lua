-- Lists handovers (see `handovers_due.lua`), each scored with Redis's time
-- now. KEYS: the list. ARGV: the members.
for _, member in ipairs(ARGV) do
  redis.call('ZADD', KEYS[1], now, member)
end
return #ARGV
