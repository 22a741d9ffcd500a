-- unique (included): uniqueness keys. `admit_unique` (enqueue) decides which entries of a call are
-- duplicates of a task that holds their key and takes the keys of the others; `release_unique`
-- (acknowledge, cancel, purge, delete) gives a key up as its task stops counting, and `retake_unique`
-- (requeue, requeue_many) takes it back as a requeued task counts again. A key holds the id of its
-- task, which counts only while its hash names one of the entry's counted segments, so a key whose
-- task finished, expired or was removed without releasing it (a crash, an older release's
-- acknowledge) admits the next enqueue instead of blocking it. Two entries of one call with one key:
-- the first is stored, the second is its duplicate. The holder's hash is the declared task prefix
-- plus the id read from the key; a stored task keeps its key's digest in field `unique`.

-- Whether `segment` is one of the comma-separated `counted`.
local function counts_in(counted, segment)
  return segment and string.find(',' .. counted .. ',', ',' .. segment .. ',', 1, true) ~= nil
end

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
  if segment and counts_in(counted or '', segment) then
    local left = redis.call('PTTL', key)
    if left < 0 or left > ttl * 1000 then
      redis.call('EXPIRE', key, ttl)
    end
    return
  end
  redis.call('DEL', key)
end

-- A requeue (requeue, requeue_many) moving the task `task_key` from `source` to `segment`: a task that starts
-- counting again (from a segment its key does not count in, to one it does) takes its key back when the key
-- is free or names a task that no longer counts in `counted`, without expiry (until it stops counting: its
-- `unique_for` is not known here); a key another counted task holds stays with that task.
local function retake_unique(task_key, id, digest, counted, source, segment)
  counted = counted or ''
  if counts_in(counted, source) or not counts_in(counted, segment) then
    return
  end
  local key = unique_key_of(task_key, id, digest)
  local holder = redis.call('GET', key)
  if holder and holder ~= id then
    local held = redis.call('HGET', string.sub(task_key, 1, #task_key - #id) .. holder, 'segment')
    if counts_in(counted, held) then
      return
    end
  end
  redis.call('SET', key, id)
end

-- Takes the keys of the free entries; returns {duplicate = {[i] = true}, reply = {stored, i, holder, ...},
-- store = function(count) -> count, which marks each unique task that took its key with the key}.
local function admit_unique(n, u)
  local duplicate, reply, taken = {}, {0}, {}
  local claimed = {}  -- key -> {id, segment} of an entry of this call that took it
  for j = 1, u do
    local t = 5 * n + 3 * j + 6
    local i, hold_ms, counted = tonumber(ARGV[t]), tonumber(ARGV[t + 1]), ARGV[t + 2]
    local key, task_key, id = KEYS[5 + 2 * n + j], KEYS[2 * i + 4], ARGV[5 * i + 4]
    local holder, segment
    if claimed[key] then
      holder, segment = claimed[key][1], claimed[key][2]
    else
      holder = redis.call('GET', key)
      if holder then
        segment = redis.call('HGET', string.sub(task_key, 1, #task_key - #id) .. holder, 'segment')
      end
    end
    if holder and counts_in(counted, segment) then
      duplicate[i] = true
      reply[#reply + 1] = i
      reply[#reply + 1] = holder
    else
      if hold_ms > 0 then
        redis.call('SET', key, id, 'PX', hold_ms)
      else
        redis.call('SET', key, id)
      end
      claimed[key] = {id, ARGV[5 * i + 6]}
      taken[#taken + 1] = {task_key, string.match(key, ':unique:(.+)$'), counted}
    end
  end
  -- `count`: the tasks the call stored (duplicates and tasks stored already by a retried call's
  -- first attempt left out).
  local function store(count)
    for _, entry in ipairs(taken) do
      redis.call('HSET', entry[1], 'unique', entry[2], 'unique_segments', entry[3])
    end
    reply[1] = count
    return count
  end
  return {duplicate = duplicate, reply = reply, store = store}
end
