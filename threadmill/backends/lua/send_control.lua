#!lua flags=allow-oom
-- send_control: leave an operator's command (quiet or stop) for worker processes' supervisors.
-- A script, not a plain HSET, so a full server (maxmemory, noeviction) takes it too: an
-- operator must be able to stop a pool that fills the server. take_control hands it over.
-- KEYS[1] (hash)   pending commands: worker name -> JSON {"command": ..., "by": ..., "at": ...}
-- ARGV[1] (string) the command's JSON document, the same for every worker
-- ARGV[2..n] (string) the names of the worker processes
-- Returns: the number of workers that had no command pending before
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('HSET', KEYS[1], ARGV[i], ARGV[1])
end
return added
