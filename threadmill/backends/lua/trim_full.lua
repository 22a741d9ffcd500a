#!lua flags=allow-oom
-- trim_full: on a server over its maxmemory, drop the oldest successful tasks of a queue, each
-- leaving a tombstone, so draining a full server frees memory instead of growing it (a stored
-- result is about twice its ready task). The tombstone (about 100 bytes) says the task finished
-- SUCCESSFUL and its result was trimmed, until the result time to live would have ended; the
-- broker's full trimmer drops older tombstones. A unique task is left whole: its result may be
-- what keeps the next duplicate out. Failed tasks are never trimmed here.
-- KEYS[1] (zset)   the queue's successful segment (score: finish time)
-- KEYS[2] (zset)   the partition's tombstones: task id -> finish time
-- KEYS[3] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[4] (prefix) result prefix of an older layout (1); today a result lives in its task hash
-- ARGV[1] (number) the most tasks to drop
-- Returns: the number of tasks dropped
local oldest = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local dropped = {}
local tombstones = {}
for i = 1, #oldest, 2 do
  local id, finished = oldest[i], oldest[i + 1]
  local key = KEYS[3] .. id
  local fields = redis.call('HMGET', key, 'segment', 'unique')
  if fields[2] == false and (fields[1] == 'successful' or fields[1] == false) then
    redis.call('DEL', key, KEYS[4] .. id)
    dropped[#dropped + 1] = id
    if fields[1] then
      tombstones[#tombstones + 1] = finished
      tombstones[#tombstones + 1] = id
    end
  end
end
-- include: chunked
if #dropped > 0 then
  call_chunked('ZREM', KEYS[1], dropped)
end
if #tombstones > 0 then
  call_chunked('ZADD', KEYS[2], tombstones)
end
return #dropped
