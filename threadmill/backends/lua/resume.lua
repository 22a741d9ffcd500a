#!lua flags=allow-oom
-- resume: let workers acquire a paused queue's tasks again, waking an idle one if tasks wait.
-- KEYS[1] (hash) paused queues: queue name -> JSON {"by": who, "since": server epoch seconds}
-- KEYS[2] (zset) the queue's ready segment
-- KEYS[3] (list) the queue's wake list
-- ARGV[1] (string) queue name
-- Returns: 1 resumed, 0 it was not paused
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[2]) > 0 and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('LPUSH', KEYS[3], '1')
end
return 1
