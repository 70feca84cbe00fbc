-- token_acquire.lua — a token bucket for callers that wait instead of being refused, with Guava's "consume now,
-- pay later" (its SmoothBursty RateLimiter): a caller not behind a debt takes its tokens at once, even more than
-- are there, and the bucket goes into debt; a caller behind a debt waits until it is repaid, then takes its
-- tokens, deepening the debt for the next one. Same hash as token_bucket.lua, whose callers are refused while
-- the bucket is in debt.
--
-- KEYS[1]  the bucket (a hash: level = tokens × per_ms, negative in debt; ts; per, capacity, rate)
-- ARGV[1]  capacity     tokens, integer ≥ 1
-- ARGV[2]  rate         tokens added per per_ms, integer ≥ 0
-- ARGV[3]  per_ms       integer ≥ 1
-- ARGV[4]  cost         tokens, integer ≥ 1
-- ARGV[5]  max_wait_ms  the longest the caller may wait
-- ARGV[6]  now_ms       optional; when absent the Redis server's TIME is used
-- ARGV[7]  adopted_ms   optional, after now_ms (then given, or empty for TIME): when the caller adopted these
--                        parameters, ms since the Unix epoch (absent: 0). lib/bucket.lua's load_bucket decides a call
--                        adopted before the hash's `adopted` with the hash's parameters
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         cost, or 0 when the wait would exceed max_wait_ms (or never ends: cost > capacity, or rate 0
--                   and too few tokens)
--   remaining       whole tokens left (0 in debt)
--   retry_after_ms  granted: how long to wait before using the tokens (the debt ahead); refused: until the
--                   wait would fit in max_wait_ms, -1 never
--   reset_after_ms  until the bucket is full again
-- The time since the last call refills (or repays the debt) at the parameters the hash records, then the level is
-- converted to this call's, as in token_bucket.lua (invariant 11): a debt taken at the old rate is repaid at it until
-- the change (Guava's testBurstyAndUpdate). A refusal writes nothing unless that conversion happened.
-- Mirrors TokenBucket::acquire in src/algorithm/token_bucket.rs, which gives the same replies and stores the same
-- state.

local capacity, rate, per, cost, max_wait = numbers(1, 5)
local now_arg = 6
if not (capacity and rate and per and cost and max_wait) or capacity < 1 or rate < 0 or per < 1 or cost < 1 or max_wait < 0 then
  return redis.error_reply('ERR token_acquire: bad arguments (capacity, rate, per_ms, cost, max_wait_ms)')
end
local now, level, ts, same, pend, noted, held, adopted, full
now, level, ts, same, pend, noted, held, capacity, rate, per, adopted, full =
  open_bucket(KEYS[1], capacity, rate, per, now_arg)

if cost > capacity or (rate == 0 and level < cost * per) then
  if not same then save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted) end
  return { 0, whole_tokens(level, per), -1, refill_ms(level, full, rate) }
end
local wait = 0
if level < 0 then wait = cdiv(-level, rate) end
if wait > max_wait then
  if not same then save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted) end
  return { 0, whole_tokens(level, per), wait - max_wait, refill_ms(level, full, rate) }
end
local room = room_of(level, per, capacity, pend, held)
level = level - cost * per
save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted)
if noted then note_room(KEYS[1], room, false, now) end
return { cost, whole_tokens(level, per), wait, refill_ms(level, full, rate) }
