-- live_leases: which of the given tasks are running under a live lease, read-only.
-- The same rule as requeue_many's: a lease is live while its deadline (the running score) is
-- ahead on the server's clock and its worker's heartbeat is no older than the worker timeout
-- (a worker with no heartbeat counts as alive). Without force, requeue_many skips these.
-- KEYS[1] (zset)   the queue's running segment (score: lease deadline)
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (zset)   worker names by last heartbeat, server epoch seconds
-- ARGV[1] (number) worker timeout, seconds
-- ARGV[2..n] (string) task ids
-- Returns: {id1, id2, ...} those of the ids running under a live lease, in the order given
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local timeout = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if deadline and tonumber(deadline) >= now then
    local worker = redis.call('HGET', KEYS[2] .. id, 'lease_worker')
    local beat = worker and redis.call('ZSCORE', KEYS[3], worker)
    if not (beat and tonumber(beat) < now - timeout) then
      out[#out + 1] = id
    end
  end
end
return out
