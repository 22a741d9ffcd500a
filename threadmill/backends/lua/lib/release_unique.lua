-- release_unique (included): give up a task's uniqueness key as the task stops counting.

-- `key` and `counted` are the task hash's `unique` and `unique_segments` fields, `segment` where the
-- task goes (nil: it is removed). The key is deleted only while it names this task (a later holder
-- keeps it). A task moving to a segment its key counts in (a kept result) keeps the key, for no
-- longer than `ttl` seconds, its data's lifetime.
local function release_unique(key, id, counted, segment, ttl)
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
