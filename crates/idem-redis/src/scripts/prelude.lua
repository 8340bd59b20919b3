-- Shared by every script. Time is Redis's clock, in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whole numbers as plain decimal text (Lua would write 1.7e+15).
local function fmt(n)
  return string.format('%.0f', n)
end

-- Whether `token` owns the record `rec` (HMGET s t l): in progress under
-- that token, lease still live.
local function owns(rec, token, now)
  return rec[1] == 'p' and rec[2] == token and tonumber(rec[3]) > now
end
