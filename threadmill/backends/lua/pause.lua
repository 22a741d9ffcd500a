#!lua flags=allow-oom
-- pause: stop workers acquiring a queue's tasks. Enqueues still land; running tasks finish.
-- Pausing a paused queue keeps who paused it first, and since when.
-- KEYS[1] (hash)   paused queues: queue name -> JSON {"by": who, "since": server epoch seconds}
-- ARGV[1] (string) queue name
-- ARGV[2] (string) who pauses it (a user name, "cli", ...)
-- Returns: 1 paused now, 0 it was paused already
local time = redis.call('TIME')
local since = tonumber(time[1]) + tonumber(time[2]) / 1000000
return redis.call('HSETNX', KEYS[1], ARGV[1], cjson.encode({by = ARGV[2], since = since}))
