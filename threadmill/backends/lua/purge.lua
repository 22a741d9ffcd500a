-- purge: delete one batch of a segment and the task data it owns.
-- Called repeatedly until it returns 0, so a huge segment never blocks the server.
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1); today a result lives in its task hash
-- ARGV[1] (number) batch size
-- ARGV[2] (string) the segment's name; a task hash naming another segment is not deleted
-- Returns: the number of ids removed from the segment in this batch
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
for _, id in ipairs(ids) do
  local key = KEYS[2] .. id
  local segment = redis.call('HGET', key, 'segment')
  if segment == ARGV[2] or not segment then
    redis.call('DEL', key, KEYS[3] .. id)
  end
  redis.call('ZREM', KEYS[1], id)
end
return #ids
