-- Shared by every script. Time is Redis's clock, in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whole numbers as plain decimal text (Lua would write 1.7e+15).
local function fmt(n)
  return string.format('%.0f', n)
end

-- A record is one packed string: state ('p' in progress, 'c' completed,
-- 'r' released), flags (1: fingerprint follows, 2: outcome follows), token,
-- lease or retention end, attempts, start or completion time; then the
-- 16-byte fingerprint and the outcome, when flagged.
local HEAD = '<c1Bi8i8i4i8'

local function decode(v)
  if not v then
    return nil
  end
  local s, flags, t, l, a, b, pos = struct.unpack(HEAD, v)
  local r = {s = s, t = t, l = l, a = a, b = b}
  if flags % 2 == 1 then
    r.fp = string.sub(v, pos, pos + 15)
    pos = pos + 16
  end
  if flags >= 2 then
    r.o = string.sub(v, pos)
  end
  return r
end

local function encode(r)
  local flags = (r.fp and 1 or 0) + (r.o and 2 or 0)
  return struct.pack(HEAD, r.s, flags, r.t, r.l, r.a, r.b) .. (r.fp or '') .. (r.o or '')
end

-- Whether `token` owns the record `r`: in progress under that token, lease
-- still live.
local function owns(r, token, now)
  return r and r.s == 'p' and r.t == tonumber(token) and r.l > now
end
