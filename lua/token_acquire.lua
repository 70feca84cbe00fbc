-- token_acquire.lua — a token bucket for callers that wait instead of being refused, with Guava's "consume now,
-- pay later" (its SmoothBursty RateLimiter): a caller not behind a debt takes its tokens at once, even more than
-- are there, and the bucket goes into debt; a caller behind a debt waits until it is repaid, then takes its
-- tokens, deepening the debt for the next one. Same hash as token_bucket.lua, whose callers are refused while
-- the bucket is in debt.
--
-- KEYS[1]  the bucket (a hash: level = tokens × per_ms, negative in debt; ts; per)
-- ARGV[1]  capacity     tokens, integer ≥ 1
-- ARGV[2]  rate         tokens added per per_ms, integer ≥ 0
-- ARGV[3]  per_ms       integer ≥ 1
-- ARGV[4]  cost         tokens, integer ≥ 1
-- ARGV[5]  max_wait_ms  the longest the caller may wait
-- ARGV[6]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         cost, or 0 when the wait would exceed max_wait_ms (or never ends: cost > capacity, or rate 0
--                   and too few tokens)
--   remaining       whole tokens left (0 in debt)
--   retry_after_ms  granted: how long to wait before using the tokens (the debt ahead); refused: until the
--                   wait would fit in max_wait_ms, -1 never
--   reset_after_ms  until the bucket is full again
-- Mirrors TokenBucket::acquire in src/algorithm/token_bucket.rs.

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
local cost = tonumber(ARGV[4])
local max_wait = tonumber(ARGV[5])
local now_arg = 6
if not (capacity and rate and per and cost and max_wait) or capacity < 1 or rate < 0 or per < 1 or cost < 1 or max_wait < 0 then
  return redis.error_reply('ERR token_acquire: bad arguments (capacity, rate, per_ms, cost, max_wait_ms)')
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
local function left(l) if l < 0 then return 0 end return idiv(l, per) end

if cost > capacity or (rate == 0 and level < cost * per) then
  return { 0, left(level), -1, reset_after_of(level) }
end
local wait = 0
if level < 0 then wait = cdiv(-level, rate) end
if wait > max_wait then
  return { 0, left(level), wait - max_wait, reset_after_of(level) }
end
level = level - cost * per
if level >= full then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'level', int(level), 'ts', int(ts), 'per', int(per))
  if rate == 0 then redis.call('PERSIST', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], int(reset_after_of(level))) end
end
return { cost, left(level), wait, reset_after_of(level) }
