-- leaky_return.lua — hand back a reserved leaky-bucket slot that will not be used (a caller gave up waiting),
-- when that is possible: only while the slot is still the last one reserved (nobody queued behind it), so
-- that no later caller's slot moves. Otherwise nothing changes and the slot leaks unused.
--
-- KEYS[1]  the queue (the hash of leaky_bucket.lua)
-- ARGV[1]  rate         tokens per per_ms, integer ≥ 1
-- ARGV[2]  per_ms       integer ≥ 1
-- ARGV[3]  cost         tokens of the reservation, integer ≥ 1
-- ARGV[4]  member       the reservation's member, as given to leaky_bucket.lua
-- ARGV[5]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { returned, 0, 0, reset_after_ms }: returned = cost when handed back, 0 when someone queued behind.
-- Mirrors src/algorithm/leaky_bucket.rs.

local rate, per, cost = numbers(1, 3)
local member = ARGV[4]
local now_arg = 5
if not (rate and per and cost and member) or rate < 1 or per < 1 or cost < 1 then
  return redis.error_reply('ERR leaky_return: bad arguments (rate, per_ms, cost, member)')
end
local now = now_of(now_arg)

local state = redis.call('HMGET', KEYS[1], 'tat_ms', 'tat_frac', 'tail')
local tat_ms, tat_frac = tonumber(state[1]), tonumber(state[2])
if state[3] ~= member or not tat_ms then
  local reset = 0
  if tat_ms and tat_ms > now then reset = tat_ms - now end
  return { 0, 0, 0, reset }
end
-- Move the TAT back by the reservation, never before now.
local tat = (tat_ms - now) * rate + tat_frac - cost * per
if tat <= 0 then
  redis.call('DEL', KEYS[1])
  return { cost, 0, 0, 0 }
end
redis.call('HSET', KEYS[1], 'tat_ms', int(now + idiv(tat, rate)), 'tat_frac', int(tat - idiv(tat, rate) * rate), 'tail', '')
redis.call('PEXPIRE', KEYS[1], int(cdiv(tat, rate) + 1))
return { cost, 0, 0, cdiv(tat, rate) }
