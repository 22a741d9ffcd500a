#!lua flags=allow-oom
-- purge: delete one batch of a segment and the task data it owns.
-- Called repeatedly until it returns 0, so a huge segment never blocks the server.
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1); today a result lives in its task hash
-- ARGV[1] (number) batch size
-- ARGV[2] (string) the segment's name; a task hash naming another segment is not deleted
-- Returns: the number of ids removed from the segment in this batch
-- A deleted unique task gives up its uniqueness key.
-- include: unique
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
for _, id in ipairs(ids) do
  local key = KEYS[2] .. id
  local fields = redis.call('HMGET', key, 'segment', 'unique')
  local segment = fields[1]
  if segment == ARGV[2] or not segment then
    if fields[2] then
      release_unique(key, id, fields[2], nil, nil, 0)
    end
    redis.call('DEL', key, KEYS[3] .. id)
  end
  redis.call('ZREM', KEYS[1], id)
end
return #ids
