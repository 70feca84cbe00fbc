-- token_bucket.lua — take tokens from a token bucket, refilled lazily from the last timestamp.
--
-- KEYS[1]  the bucket (a hash: level = tokens × per_ms, ts = ms of the last computation, per = per_ms it was computed with)
-- ARGV[1]  capacity   tokens, integer ≥ 1 (the burst)
-- ARGV[2]  rate       tokens added per `per_ms`, integer ≥ 0 (0: a stock that never refills)
-- ARGV[3]  per_ms     integer ≥ 1
-- ARGV[4]  min        tokens, integer ≥ 1: grant nothing unless at least this many are there (the cost)
-- ARGV[5]  max        tokens, integer ≥ min: grant at most this many (the batch of a lease)
-- ARGV[6]  now_ms     optional; when absent the Redis server's TIME is used (tests pass it to replay sequences)
--
-- With a second key, the rule bans after a breach (e.g. a 'like' limit that refuses the user for an hour):
-- KEYS[2]  the ban (a string: ms until which the key is banned)
-- ARGV[6]  ban_ms     after a refusal, refuse the key this long
-- ARGV[7]  now_ms     optional, as above
-- A banned key is refused with retry_after_ms = the ban's rest.
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
-- expires when it would be full again, so idle keys clean themselves up. Mirrors src/algorithm/token_bucket.rs.

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return idiv(a + b - 1, b) end -- ceil(a / b) for integers, b ≥ 1
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'

local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local per = tonumber(ARGV[3])
local min = tonumber(ARGV[4])
local max = tonumber(ARGV[5])
local ban_key, ban_ms = KEYS[2], 0
local now_arg = 6
if ban_key then ban_ms, now_arg = tonumber(ARGV[6]), 7 end
if not (capacity and rate and per and min and max and ban_ms) or capacity < 1 or rate < 0 or per < 1 or min < 1 or max < min or ban_ms < 0 then
  return redis.error_reply('ERR token_bucket: bad arguments (capacity, rate, per_ms, min, max)')
end
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

local full = capacity * per
local state = redis.call('HMGET', KEYS[1], 'level', 'ts', 'per')
local level, ts, old_per = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
if level == nil or ts == nil then
  level, ts = full, now
else
  if old_per and old_per ~= per and old_per > 0 then level = idiv(level * per, old_per) end
  if now > ts then
    level = level + (now - ts) * rate
    ts = now
  end
  if level > full then level = full end
end

local function reset_after_of(l)
  if l >= full then return 0 elseif rate == 0 then return -1 else return cdiv(full - l, rate) end
end
local function whole(l) if l < 0 then return 0 end return idiv(l, per) end -- remaining: 0 in debt
local function at_least(reset, ms) if reset == -1 or reset >= ms then return reset end return ms end

if ban_key then
  local banned_until = tonumber(redis.call('GET', ban_key) or '0') or 0
  if banned_until > now then
    local left = banned_until - now
    return { 0, whole(level), left, at_least(reset_after_of(level), left) }
  end
end

local granted, retry_after = 0, 0
local tokens = idiv(level, per)
if min > capacity then
  retry_after = -1
elseif tokens >= min then
  granted = tokens
  if granted > max then granted = max end
  level = level - granted * per
elseif rate == 0 then
  retry_after = -1
else
  retry_after = cdiv(min * per - level, rate)
end

local reset_after = reset_after_of(level)
if granted == 0 and ban_ms > 0 then
  redis.call('SET', ban_key, int(now + ban_ms), 'PX', int(ban_ms))
  retry_after = ban_ms
  reset_after = at_least(reset_after, ban_ms)
end

if granted > 0 then
  if level >= full then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 'level', int(level), 'ts', int(ts), 'per', int(per))
    if rate == 0 then redis.call('PERSIST', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], int(reset_after)) end
  end
end
return { granted, whole(level), retry_after, reset_after }
