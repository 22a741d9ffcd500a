-- awaits_release: whether a task of some queues waits on a parent that can still end, for `--exit-empty`.
-- True when one queue's waiting segment holds a task and one queue's ready or running segment holds
-- one: the running (or ready) task may be the waiting one's parent, and its acknowledgement may release
-- it; or when the settling list holds a release an acknowledgement cut short, which its worker (or the
-- sweeper) is continuing. Parents in queues not given here are not looked at (a pool that does not
-- serve them exits).
-- KEYS[1]    (list) the settling list (lib/workflow)
-- KEYS[3j-1] (zset) queue j's waiting segment
-- KEYS[3j]   (zset) queue j's ready segment
-- KEYS[3j+1] (zset) queue j's running segment
-- Returns: 1 when a waiting task may still be released by the queues' own work, else 0
local waiting = false
local m = (#KEYS - 1) / 3
for j = 1, m do
  waiting = waiting or #redis.call('ZRANGE', KEYS[3 * j - 1], 0, 0) > 0
  if waiting then
    break
  end
end
if not waiting then
  return 0  -- the common case, no workflow waiting: one command a queue
end
for j = 1, m do
  if #redis.call('ZRANGE', KEYS[3 * j], 0, 0) > 0 or #redis.call('ZRANGE', KEYS[3 * j + 1], 0, 0) > 0 then
    return 1
  end
end
return redis.call('LLEN', KEYS[1]) > 0 and 1 or 0
