#!lua flags=allow-oom
-- pause_schedule: stop the broker enqueueing a schedule's runs, keeping who paused it first.
-- A script, not a plain HSETNX, so a full server (maxmemory, noeviction) takes it too.
-- KEYS[1] (hash)   the schedules' stored state: "<name>:paused" -> JSON {"by": ..., "since": ...}
-- ARGV[1] (string) the field, "<name>:paused"
-- ARGV[2] (string) the pause's JSON document
-- Returns: 1 paused now, 0 it was paused already
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
