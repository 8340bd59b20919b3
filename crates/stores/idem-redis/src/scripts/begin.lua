-- begin, part two: what `begin_first.lua` did not answer. `first` is the
-- record of a lone key, when it had one.
local out = {now}
for i = 1, #KEYS do
  local rec, fp = KEYS[i], ARGV[3 + i]
  local old = first or claim(rec, fp)
  if not old then
    out[i + 1] = floor
  else
    local r = decode(old)
    if fp == '' then
      fp = nil
    end
    -- Both fingerprints present and different.
    local differs = r.fp and fp and r.fp ~= fp
    local attempt = 1
    local answer = nil
    if r.s == 'p' then
      if r.l <= now then
        attempt = r.a + 1
      elseif differs then
        answer = {'m'}
      else
        answer = {'i', r.l - now}
      end
    elseif r.s == 'c' and r.l > now then
      if differs then
        answer = {'m'}
      else
        answer = {'c', r.b, r.o}
      end
    end
    if not answer then
      -- A lapsed lease, a released key's tombstone, or a completion whose
      -- retention ends this millisecond: acquired, with a greater token.
      local token = math.max(r.t + 1, floor)
      redis.call('SET', rec, encode({s = 'p', t = token, l = lease_until, a = attempt, b = now, fp = fp}),
        'PX', life)
      answer = {'a', token, attempt}
    end
    out[i + 1] = answer
  end
end
return out
