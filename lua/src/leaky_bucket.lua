-- leaky_bucket.lua — a leaky-bucket queue (GCRA): callers reserve the next slot of a shared schedule that leaks
-- `rate` tokens every `per_ms`, and wait for it; a call whose wait would exceed max_wait_ms is refused.
-- It paces blocking background jobs (e.g. a reindex at 20 per second): one call per job, shared by every process.
--
-- KEYS[1]  the queue (a hash: the theoretical arrival time TAT = tat_ms + tat_frac / rate ms, kept exactly so
--          that rates above 1000 per second pace right; rate = the rate tat_frac was counted in; tail = the member
--          of the last reservation, so that leaky_return.lua can hand it back)
-- ARGV[1]  rate         tokens per per_ms, integer ≥ 1
-- ARGV[2]  per_ms       integer ≥ 1
-- ARGV[3]  cost         tokens, integer ≥ 0 (0: a peek at the queue, which reserves nothing)
-- ARGV[4]  max_wait_ms  the longest a caller may wait for its slot (0: only a free slot now)
-- ARGV[5]  member       a unique id of this reservation
-- ARGV[6]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         cost, or 0 when the wait would exceed max_wait_ms
--   remaining       tokens that could still be reserved now without waiting more than max_wait_ms
--   retry_after_ms  granted: how long to wait for the reserved slot; refused: until the wait fits in max_wait_ms
--   reset_after_ms  until the queue is empty (the TAT)
-- Mirrors src/algorithm/leaky_bucket.rs.

local rate, per, cost, max_wait = numbers(1, 4)
local member = ARGV[5]
local now_arg = 6
if not (rate and per and cost and max_wait and member) or rate < 1 or per < 1 or cost < 0 or max_wait < 0 then
  return redis.error_reply('ERR leaky_bucket: bad arguments (rate, per_ms, cost, max_wait_ms)')
end
local now = now_of(now_arg)

-- The slot starts at max(TAT, now); times are in units of 1/rate ms relative to now.
local state = redis.call('HMGET', KEYS[1], 'tat_ms', 'tat_frac', 'rate')
local tat_ms, tat_frac, old_rate = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3])
if old_rate and old_rate ~= rate and old_rate > 0 then tat_frac = idiv(tat_frac * rate, old_rate) end
local wait = 0
if tat_ms and (tat_ms > now or (tat_ms == now and tat_frac > 0)) then
  wait = (tat_ms - now) * rate + tat_frac
end
local limit = max_wait * rate
local step = cost * per

if wait > limit then
  return { 0, 0, cdiv(wait - limit, rate), cdiv(wait, rate) }
end

if cost == 0 then -- a peek: the queue as it is, nothing reserved
  return { 0, idiv(limit - wait, per) + 1, 0, cdiv(wait, rate) }
end
local tat = wait + step                      -- the new TAT, relative to now
local new_ms = now + idiv(tat, rate)
local new_frac = tat - idiv(tat, rate) * rate
redis.call('HSET', KEYS[1], 'tat_ms', int(new_ms), 'tat_frac', int(new_frac), 'rate', int(rate), 'tail', member)
redis.call('PEXPIRE', KEYS[1], int(cdiv(tat, rate) + 1))
local remaining = 0
if tat <= limit then remaining = idiv(limit - tat, per) + 1 end
return { cost, remaining, cdiv(wait, rate), cdiv(tat, rate) }
