-- token_bucket.lua — take tokens from a token bucket, refilled lazily from the last timestamp.
--
-- KEYS[1]  the bucket (a hash: level = tokens × per_ms, negative in debt; ts = ms of the last computation; per,
--          capacity, rate = the parameters it was computed with)
-- ARGV[1]  capacity   tokens, integer ≥ 1 (the burst)
-- ARGV[2]  rate       tokens added per `per_ms`, integer ≥ 0 (0: a stock that never refills)
-- ARGV[3]  per_ms     integer ≥ 1
-- ARGV[4]  min        tokens, integer ≥ 1: grant nothing unless at least this many are there (the cost)
-- ARGV[5]  max        tokens, integer ≥ min: grant at most this many (the batch of a lease)
--          min = max = 0 is a peek: it answers as a call of one token would, and takes and bans nothing
-- ARGV[6]  now_ms     optional; when absent the Redis server's TIME is used (tests pass it to replay sequences)
--
-- With a second key, the rule bans after a breach (e.g. a 'like' limit that refuses the user for an hour):
-- KEYS[2]  the ban (a string: ms until which the key is banned)
-- ARGV[6]  ban_ms     after a refusal, refuse the key this long
-- ARGV[7]  now_ms     optional, as above
--
-- ARGV[7], or ARGV[8] with the ban: adopted_ms, optional, after now_ms (then given, or empty for TIME): when the
--          caller adopted these parameters, ms since the Unix epoch (absent: 0); lib/bucket.lua's load_bucket
--          decides a call adopted before the hash's `adopted` with the hash's parameters
-- A banned key is refused with retry_after_ms = the ban's rest. (A `hold` field a process older than 2026-11-28
-- wrote after a debit is ignored: nothing is sold on credit any more.)
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         tokens granted: 0, or between min and max
--   remaining       whole tokens left after this call
--   retry_after_ms  0 when granted; else ms until `min` tokens are there; -1 when never (min > capacity, or rate 0)
--   reset_after_ms  ms until the bucket is full again; -1 when never (rate 0)
--
-- Arithmetic is exact on integers below 2^53: the level is kept in units of 1/per_ms token, so a refill of
-- `rate` tokens per `per_ms` adds exactly `rate` units a millisecond and a token due at a millisecond is there at it.
-- A new (or expired) key starts full. A full bucket is deleted (it equals a missing key); otherwise the key
-- expires when it would be full again, so idle keys clean themselves up.
-- Reloads (invariant 11): the time since the last call refills at the parameters the hash records, then the level
-- is converted to this call's parameters (rescaled to per_ms, capped at capacity), which the hash records from then
-- on. A refusal writes nothing unless that conversion happened (then it stores the converted bucket, so the time
-- after the change refills at the new rate). Mirrors src/algorithm/token_bucket.rs, which gives the same replies
-- and stores the same state.

local capacity, rate, per, min, max = numbers(1, 5)
local ban_key, ban_ms = KEYS[2], 0
local now_arg = 6
if ban_key then ban_ms, now_arg = numbers(6, 6), 7 end
if not (capacity and rate and per and min and max and ban_ms) or capacity < 1 or rate < 0 or per < 1 or min < 0 or max < min or (min == 0 and max > 0) or ban_ms < 0 then
  return redis.error_reply('ERR token_bucket: bad arguments (capacity, rate, per_ms, min, max)')
end
local now, level, ts, same, pend, noted, held, adopted, full
now, level, ts, same, pend, noted, held, capacity, rate, per, adopted, full =
  open_bucket(KEYS[1], capacity, rate, per, now_arg)
local function at_least(reset, ms) if reset == -1 or reset >= ms then return reset end return ms end

if ban_key then
  local left = ban_left(ban_key, now)
  if left > 0 then
    if not same then save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted) end
    return { 0, whole_tokens(level, per), left, at_least(refill_ms(level, full, rate), left) }
  end
end

-- min = max = 0 is a peek: the bucket as it is and what a call of one token would wait; nothing taken or banned.
local peek, need = min == 0, min
if peek then need = 1 end
local granted, retry_after, room
granted, level, retry_after, room = take(level, per, capacity, rate, pend, held, need, max)

local reset_after = refill_ms(level, full, rate)
if granted == 0 and ban_ms > 0 and not peek then
  ban(ban_key, now, ban_ms)
  retry_after = ban_ms
  reset_after = at_least(reset_after, ban_ms)
end

if granted > 0 or not same then save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted) end
if granted > 0 and noted then note_room(KEYS[1], room, false, now) end
return { granted, whole_tokens(level, per), retry_after, reset_after }
