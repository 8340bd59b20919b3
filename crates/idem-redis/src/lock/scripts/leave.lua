-- lock: a waiter gives up. KEYS: queue, queue deadlines, wake list.
-- ARGV: waiter id.
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
