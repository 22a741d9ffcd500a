-- limited_task (included): store a workflow task's per-task limit as enqueue.lua stores a limited task's.

-- Mark task hash `task_key` of `queue` with the limit in `limited` ("<path>|<limit>", `limits.limit_suffix`
-- without its leading "|"; "" for a task without one): field `limit_path`, the path's limit in hash
-- `limits_key` and the queue in hash `queues_key`, which acquire reads to hold the task to its limit.
local function mark_limited(task_key, queue, limited, limits_key, queues_key)
  if limited == '' then
    return
  end
  local path, limit = string.match(limited, '^([^|]+)|(.*)$')
  redis.call('HSET', task_key, 'limit_path', path)
  redis.call('HSET', limits_key, path, limit)
  redis.call('HSET', queues_key, queue, '1')
end
