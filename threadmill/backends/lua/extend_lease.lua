#!lua flags=allow-oom
-- extend_lease: push a running task's lease deadline out so it covers the run about to start,
-- fenced by its lease token. A task with a time limit runs at most limit + timeout_grace before its
-- worker process is replaced, so a lease that long never expires under a live run, whatever
-- lease_ttl is. The deadline never moves earlier. Only the score changes: the previous release's
-- reaper and recovery read it as they always did.
-- KEYS[1] (hash)   the task
-- KEYS[2] (zset)   its queue's running segment (score: lease deadline)
-- ARGV[1] (string) the task id
-- ARGV[2] (string) the lease token the task must still hold
-- ARGV[3] (number) seconds from the server's now the lease must last at least
-- Returns: the stored lease deadline (epoch seconds, as text), or false when the fence refused it
-- (the lease was taken back)
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[2] then
  return false
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then
  return false
end
local time = redis.call('TIME')
local wanted = tonumber(time[1]) + tonumber(time[2]) / 1000000 + tonumber(ARGV[3])
if wanted <= tonumber(score) then
  return score
end
local deadline = string.format('%.6f', wanted)
redis.call('ZADD', KEYS[2], 'XX', deadline, ARGV[1])
return deadline
