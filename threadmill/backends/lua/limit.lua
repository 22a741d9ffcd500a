#!lua flags=allow-oom
-- limit: set or clear a queue's runtime limits, which win over the settings' until cleared.
-- Each part of the stored value is kept unless given, so `--rate` leaves a runtime concurrency.
-- A changed limit may leave room: an idle worker is woken if tasks are ready.
-- KEYS[1] (hash) runtime limits: queue name -> "concurrency|rate count|rate period s" (an empty part
--         takes the setting's), and `<queue>:set` -> JSON {"by": who, "since": server epoch seconds}
-- KEYS[2] (zset) the queue's ready segment
-- KEYS[3] (list) the queue's wake list
-- ARGV[1] (string) queue name
-- ARGV[2] (string) "set" or "clear"
-- ARGV[3] (string) with "set": the parts given, "concurrency|rate count|rate period s", empty parts kept
-- ARGV[4] (string) who sets it (a user name, "... (command line)")
-- Returns: the stored value after the call, false once cleared
-- include: limits
local queue = ARGV[1]
if ARGV[2] == 'clear' then
  redis.call('HDEL', KEYS[1], queue, queue .. ':set')
else
  local c, r, p = limit_overlay(redis.call('HGET', KEYS[1], queue), ARGV[3])
  local time = redis.call('TIME')
  local since = tonumber(time[1]) + tonumber(time[2]) / 1000000
  redis.call('HSET', KEYS[1], queue, c .. '|' .. r .. '|' .. p, queue .. ':set',
    cjson.encode({by = ARGV[4], since = since}))
end
if redis.call('ZCARD', KEYS[2]) > 0 and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('LPUSH', KEYS[3], '1')
end
return redis.call('HGET', KEYS[1], queue)
