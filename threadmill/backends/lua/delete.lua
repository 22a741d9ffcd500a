#!lua flags=allow-oom
-- delete: remove selected tasks of one segment of a queue, with their data and results.
-- A task that moved to another segment (or queue) since the caller saw it is left alone, so
-- a console acting on a stale page never deletes a task it did not show.
-- KEYS[1] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2] (prefix) result prefix of an older layout (1); today a result lives in its task hash
-- KEYS[3] (zset)   the segment the tasks must still be in
-- ARGV[1] (string) the queue's name
-- ARGV[2] (string) the segment's name
-- ARGV[3..n] (string) task ids
-- Returns: {id1, id2, ...} the ids deleted; an id left in the segment whose task data
--          already expired counts as deleted (its entry is removed)
-- A deleted unique task gives up its uniqueness key.
-- include: unique
local deleted = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = KEYS[1] .. id
  local fields = redis.call('HMGET', key, 'queue', 'segment', 'unique')
  local here = fields[1] == ARGV[1] and fields[2] == ARGV[2]
  if here or (not fields[1] and redis.call('ZSCORE', KEYS[3], id)) then
    if fields[3] then
      release_unique(key, id, fields[3], nil, nil, 0)
    end
    redis.call('ZREM', KEYS[3], id)
    redis.call('DEL', key, KEYS[2] .. id)
    deleted[#deleted + 1] = id
  end
end
return deleted
