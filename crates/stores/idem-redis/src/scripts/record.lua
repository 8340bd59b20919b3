-- Shared by the scripts that read and write whole records.
-- A record is one packed string: state ('p' in progress, 'c' completed,
-- 'r' released), flags (1: fingerprint follows, 2: outcome follows), lease
-- or retention end, start or completion time, token, attempts (bytes 1, 2,
-- 3-10, 11-18, 19-26, 27-30); then the 16-byte fingerprint and the
-- outcome, when flagged. The order lets `complete` keep token, attempts and
-- fingerprint as one piece and write the times it shares with its batch.
local HEAD = '<c1Bi8i8i8i4'

local function decode(v)
  if not v then
    return nil
  end
  local s, flags, l, b, t, a, pos = struct.unpack(HEAD, v)
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
  return struct.pack(HEAD, r.s, flags, r.l, r.b, r.t, r.a) .. (r.fp or '') .. (r.o or '')
end

-- Whether `token` owns the record `r`: in progress under that token, lease
-- still live.
local function owns(r, token, now)
  return r and r.s == 'p' and r.t == tonumber(token) and r.l > now
end
