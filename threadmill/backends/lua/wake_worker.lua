#!lua flags=allow-oom
-- wake_worker: wake one worker process that waits for tasks, so it notices its stop at once.
-- A script, not a plain LPUSH, so a full server (maxmemory, noeviction) takes it too: the
-- token is 1 byte, and without it a stopping process waits out its idle timeout.
-- KEYS[1] (list)   the worker's own wake list (the one its BLPOP waits on with its queues')
-- ARGV[1] (number) seconds the token lives, so a token no process takes does not stay
-- Returns: the list's length after the push
local length = redis.call('LPUSH', KEYS[1], '1')
redis.call('EXPIRE', KEYS[1], ARGV[1])
return length
