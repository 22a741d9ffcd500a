#!lua flags=allow-oom
-- record_task_stats: add a worker process's per-task-path counts (threadmill.backends.taskstats)
-- to each queue's hashes of this minute, this hour and since first use. The task paths a queue
-- counts are kept in a set of at most ARGV[2]; a path beyond them is counted as ARGV[3]. The
-- minute and hour hashes expire ARGV[1] seconds after their last write; the totals and the set
-- of paths do not expire (they are bounded by the cap).
-- KEYS[4j-3] (hash) queue j's counts of this minute (1 <= j <= m)
-- KEYS[4j-2] (hash) queue j's counts of this hour
-- KEYS[4j-1] (hash) queue j's counts since first use
-- KEYS[4j]   (set)  queue j's counted task paths
-- ARGV[1] (number) seconds the minute and hour hashes live
-- ARGV[2] (number) most task paths counted per queue
-- ARGV[3] (string) the path the ones beyond the cap count as
-- then per queue j: the number of its paths, and per path: the path, the number of its counts,
-- and that many (name, increment) pairs
-- Returns: the number of counts added
local ttl, cap, other = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local a, added = 4, 0
for j = 1, #KEYS / 4 do
  local minute, hour, totals, paths = KEYS[4 * j - 3], KEYS[4 * j - 2], KEYS[4 * j - 1], KEYS[4 * j]
  local path_count = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, path_count do
    local path, counts = ARGV[a], tonumber(ARGV[a + 1])
    a = a + 2
    if redis.call('SISMEMBER', paths, path) == 0 then
      if redis.call('SCARD', paths) < cap then
        redis.call('SADD', paths, path)
      else
        path = other
      end
    end
    for _ = 1, counts do
      local name, by = path .. '|' .. ARGV[a], ARGV[a + 1]
      a = a + 2
      redis.call('HINCRBY', minute, name, by)
      redis.call('HINCRBY', hour, name, by)
      redis.call('HINCRBY', totals, name, by)
      added = added + 1
    end
  end
  redis.call('EXPIRE', minute, ttl)
  redis.call('EXPIRE', hour, ttl)
end
return added
