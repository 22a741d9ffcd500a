-- release_unique (included): give up a task's uniqueness key as the task stops counting.

-- The uniqueness key `<prefix>:unique:<digest>` of the task hash `task_key` (`<prefix>:task:<id>`,
-- a declared key) and the digest in its `unique` field: the same hash tag, so the same slot.
local function unique_key_of(task_key, id, digest)
  return string.sub(task_key, 1, #task_key - #id - #'task:') .. 'unique:' .. digest
end

-- `digest` and `counted` are the task hash's `unique` and `unique_segments` fields, `segment` where the
-- task goes (nil: it is removed). The key is deleted only while it names this task (a later holder
-- keeps it). A task moving to a segment its key counts in (a kept result) keeps the key, for no
-- longer than `ttl` seconds, its data's lifetime.
local function release_unique(task_key, id, digest, counted, segment, ttl)
  local key = unique_key_of(task_key, id, digest)
  if redis.call('GET', key) ~= id then
    return
  end
  if segment and string.find(',' .. (counted or '') .. ',', ',' .. segment .. ',', 1, true) then
    local left = redis.call('PTTL', key)
    if left < 0 or left > ttl * 1000 then
      redis.call('EXPIRE', key, ttl)
    end
    return
  end
  redis.call('DEL', key)
end
