-- leased fence: check and record a fencing token, then run fenced commands,
-- all in one script (Redis runs a script atomically: nothing else runs
-- in between).
--
-- KEYS[1]     the fence key of the resource
-- KEYS[2..]   the keys of the commands, in order
-- ARGV[1]     the token, as a canonical decimal string
-- ARGV[2]     the number of commands
-- then, per command: name, number of keys, number of args, args...
--
-- Returns {1} when accepted, {0, highest} when the token is stale.
-- Redis cannot roll back, so every check that could fail happens before the
-- first write: the token, the command names, and the type of every key
-- (simulated across the commands of this call).

-- Tokens are compared as decimal strings: Lua numbers are doubles and lose
-- precision above 2^53.
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local token = ARGV[1]
local highest = redis.call('GET', KEYS[1])
if highest then
  if not string.match(highest, '^[1-9][0-9]*$') then
    return redis.error_reply('LEASEDFENCE corrupt token at ' .. KEYS[1])
  end
  if less(token, highest) then
    return {0, highest}
  end
end

-- The type a command needs its key to have ('*': any), and the type it
-- leaves the key with.
local needs = {SET = '*', DEL = '*', HSET = 'hash', HDEL = 'hash',
  RPUSH = 'list', LPUSH = 'list', SADD = 'set', SREM = 'set'}
local leaves = {SET = 'string', DEL = 'none', HSET = 'hash', HDEL = 'hash',
  RPUSH = 'list', LPUSH = 'list', SADD = 'set', SREM = 'set'}

local types, calls = {}, {}
local k, a = 2, 3
for _ = 1, tonumber(ARGV[2]) do
  local name, nkeys, nargs = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local need = needs[name]
  if not need then
    return redis.error_reply('LEASEDFENCE unsupported command ' .. name)
  end
  local call = {name}
  for _ = 1, nkeys do
    local key = KEYS[k]
    k = k + 1
    local t = types[key] or redis.call('TYPE', key)['ok']
    if need ~= '*' and t ~= 'none' and t ~= need then
      return redis.error_reply('LEASEDFENCE WRONGTYPE ' .. name .. ' on a ' .. t .. ' key')
    end
    types[key] = leaves[name]
    call[#call + 1] = key
  end
  for _ = 1, nargs do
    call[#call + 1] = ARGV[a]
    a = a + 1
  end
  calls[#calls + 1] = call
end

redis.call('SET', KEYS[1], token)
for _, call in ipairs(calls) do
  redis.call(unpack(call))
end
return {1}
