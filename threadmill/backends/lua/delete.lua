-- delete: remove selected tasks from their queue, with their data and result.
-- KEYS[1]    (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2]    (prefix) result prefix
-- KEYS[3]    (prefix) segment prefix; a segment's key is this plus queue .. ':' .. segment
-- ARGV[1..n] (string) task ids
-- Returns: the number of tasks deleted
local deleted = 0
for _, id in ipairs(ARGV) do
  local key = KEYS[1] .. id
  local fields = redis.call('HMGET', key, 'queue', 'segment')
  if fields[1] then
    redis.call('ZREM', KEYS[3] .. fields[1] .. ':' .. fields[2], id)
    redis.call('DEL', key, KEYS[2] .. id)
    deleted = deleted + 1
  end
end
return deleted
