-- Shared by the scripts that keep time: Redis's clock, in milliseconds,
-- read first thing. Numbers go to Redis and back as Lua numbers: exact up
-- to 2^53, and tokens (ms × 1024) stay below that until the year 2248.
local now
do
  local t = redis.call('TIME')
  -- Arithmetic turns the strings into numbers; cheaper than tonumber().
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
