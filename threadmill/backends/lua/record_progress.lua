#!lua flags=allow-oom
-- record_progress: record that a suspect's run starts or finishes under its lease, fenced by its token.
-- A suspect (a task that was in a lost worker's lease) is leased with `progress` "<token> leased"
-- (acquire). Its worker records "started" before the run and "finished" once it returns, so if
-- this worker is lost too, recovery knows whether the run was under way, instead of trusting a
-- heartbeat up to one interval old. A finished run also ends the task's streak of lost workers
-- (`worker_losses` is dropped): it did not take its worker down.
-- KEYS[1] (hash)   the task
-- ARGV[1] (string) the lease token the task must still hold
-- ARGV[2] (string) "started" or "finished"
-- Returns: 1 recorded; 0 the fence refused it (the lease was taken back)
if ARGV[2] ~= 'started' and ARGV[2] ~= 'finished' then
  return redis.error_reply('record_progress takes "started" or "finished", not ' .. ARGV[2])
end
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[1] .. ' ' .. ARGV[2])
if ARGV[2] == 'finished' then
  redis.call('HDEL', KEYS[1], 'worker_losses')
end
return 1
