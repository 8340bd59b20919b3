-- The token high-water mark (docs/contract.md §2, "Tiers"): the highest
-- token imported or floor raised, kept without expiry. KEYS: the mark.
-- ARGV: a token (decimal text) to raise it to, when higher ('0' to read).
-- Returns the mark (text) and Redis's time (ms).
local mark = redis.call('GET', KEYS[1]) or '0'
local given = ARGV[1]
-- Decimal text without leading zeros: the longer is the larger, and of
-- equal length the later in byte order. Exact for every 64-bit token,
-- where Lua's numbers are exact only up to 2^53.
if #given > #mark or (#given == #mark and given > mark) then
  redis.call('SET', KEYS[1], given)
  mark = given
end
return {mark, now}
