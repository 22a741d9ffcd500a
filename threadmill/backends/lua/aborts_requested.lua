-- aborts_requested: tell a worker which of the tasks it runs an operator asked to abort (see cancel.lua).
-- Read only. A task whose lease_token is no longer the one given (its lease was taken back) is
-- not this worker's to abort, and reads as none.
-- KEYS[i] (hash)   task i
-- ARGV[i] (string) task i's lease token
-- Returns: {request_1, ..., request_n}: the stored abort request (JSON), or false for none
local requests = {}
for i = 1, #KEYS do
  local fields = redis.call('HMGET', KEYS[i], 'lease_token', 'abort_requested')
  if fields[1] == ARGV[i] and fields[2] then
    requests[i] = fields[2]
  else
    requests[i] = false
  end
end
return requests
