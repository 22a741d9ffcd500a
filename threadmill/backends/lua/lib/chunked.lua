-- chunked (included): one command over a long list of arguments, in bounded chunks.

-- unpack() puts every element on Lua's stack, which is bounded: long lists go in chunks (an even size, so
-- score/member pairs stay together).
local CHUNK = 500

-- Call `command` on `key` with every element of `list` (none: no call), CHUNK elements a call.
local function call_chunked(command, key, list)
  for first = 1, #list, CHUNK do
    redis.call(command, key, unpack(list, first, math.min(first + CHUNK - 1, #list)))
  end
end
