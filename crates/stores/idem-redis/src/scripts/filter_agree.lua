-- A shared key filter's settings, the same for every process: those kept
-- under KEYS[1] (a hash), or ARGV's when none are (then kept). ARGV: seed
-- (32 hex digits), bits, hashes, window (ms), generations, epoch (a
-- random number the parts' keys are named by). Returns the six as kept.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'seed', ARGV[1], 'bits', ARGV[2], 'hashes', ARGV[3], 'window_ms', ARGV[4],
    'generations', ARGV[5], 'epoch', ARGV[6])
end
-- Settings kept without an epoch (by an idem before epochs) get one now:
-- their parts, named without it, are left to expire.
redis.call('HSETNX', KEYS[1], 'epoch', ARGV[6])
return redis.call('HMGET', KEYS[1], 'seed', 'bits', 'hashes', 'window_ms', 'generations', 'epoch')
