#!lua flags=allow-oom
-- take_control: hand a supervisor the operators' commands for its worker processes, once.
-- A command (quiet or stop) waits in the control hash until the supervisor of that worker
-- takes it, so a busy or restarting process cannot miss it (pub/sub would drop it).
-- KEYS[1] (hash)   pending commands: worker name -> JSON {"command": ..., "by": ..., "at": ...}
-- ARGV[1..n] (string) the names of the supervisor's worker processes
-- Returns: {name1, command1, name2, command2, ...} for the workers that had one (now removed)
local pending = redis.call('HMGET', KEYS[1], unpack(ARGV))
local out = {}
for i, command in ipairs(pending) do
  if command then
    redis.call('HDEL', KEYS[1], ARGV[i])
    out[#out + 1] = ARGV[i]
    out[#out + 1] = command
  end
end
return out
