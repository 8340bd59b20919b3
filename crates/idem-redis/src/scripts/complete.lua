-- complete, for one or many keys in one call (all in one hash slot on a
-- cluster). KEYS: record, for each item. ARGV, for each item: token,
-- retention ms, '1' when an outcome follows, outcome.
-- Returns, for each item, 1 (done) or 0 (stale).
local now = now_ms()
local now_text = fmt(now)
local out = {}
for i = 1, #KEYS do
  local rec = KEYS[i]
  local token, retention = ARGV[4 * i - 3], tonumber(ARGV[4 * i - 2])
  local r = redis.call('HMGET', rec, 's', 't', 'l')
  if owns(r, token, now) then
    local expires = now + retention
    if ARGV[4 * i - 1] == '1' then
      redis.call('HSET', rec, 's', 'c', 'l', fmt(expires), 'b', now_text, 'o', ARGV[4 * i])
    else
      redis.call('HSET', rec, 's', 'c', 'l', fmt(expires), 'b', now_text)
    end
    redis.call('PEXPIREAT', rec, expires)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
