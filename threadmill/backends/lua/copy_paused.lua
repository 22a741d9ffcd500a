#!lua flags=allow-oom
-- copy_paused: copy partition 0's paused queues and runtime limits into another partition,
-- keeping what that partition has, so a pause or limit holds in a partition added later.
-- A script, not plain HSETNXs, so a full server (maxmemory, noeviction) takes it too: every
-- worker start on a partitioned alias copies them, and a refusal failed the start.
-- KEYS[1] (hash)   the partition's paused queues: queue name -> JSON {"by": ..., "since": ...}
-- KEYS[2] (hash)   the partition's runtime limits: queue name (or "<queue>:set") -> value
-- ARGV[1] (number) p, the number of paused queues given
-- ARGV[2..2p+1] (string) partition 0's paused queues: name, document, name, document, ...
-- ARGV[2p+2..] (string) partition 0's runtime limits: field, value, field, value, ...
-- Returns: the number of fields copied (those the partition lacked)
local p = tonumber(ARGV[1])
local copied = 0
for i = 2, #ARGV, 2 do
  copied = copied + redis.call('HSETNX', i <= 2 * p and KEYS[1] or KEYS[2], ARGV[i], ARGV[i + 1])
end
return copied
