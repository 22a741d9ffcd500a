-- rows (included): the reply rows of peek and peek_after, one task each.

-- Append to `out` one row per (id, score) of `ids` (a WITHSCORES reply): id, data, result,
-- started_at, lease_worker, lease_started_at, lease_token, read_error, score, reported_progress;
-- absent values are false. `task_prefix` and `result_prefix` carry the segment's hash tag.
local function append_rows(out, ids, task_prefix, result_prefix)
  for i = 1, #ids, 2 do
    local id = ids[i]
    local f = redis.call('HMGET', task_prefix .. id, 'data', 'started_at', 'lease_worker', 'lease_started_at',
      'lease_token', 'read_error', 'result', 'reported_progress')
    out[#out + 1] = id
    out[#out + 1] = f[1]
    out[#out + 1] = f[7] or redis.call('GET', result_prefix .. id)
    out[#out + 1] = f[2]
    out[#out + 1] = f[3]
    out[#out + 1] = f[4]
    out[#out + 1] = f[5]
    out[#out + 1] = f[6]
    out[#out + 1] = ids[i + 1]
    out[#out + 1] = f[8]
  end
  return out
end
