-- token_return.lua — give leased but unused tokens back to a token bucket, capped at its capacity; or, with a
-- negative count, charge it with tokens admitted elsewhere (a debit).
--
-- KEYS[1]  the bucket (same hash as token_bucket.lua: level = tokens × per_ms, ts, per)
-- ARGV[1]  capacity   tokens, integer ≥ 1
-- ARGV[2]  rate       tokens per `per_ms`, integer ≥ 0
-- ARGV[3]  per_ms     integer ≥ 1
-- ARGV[4]  tokens     tokens given back, integer; negative: a debit of that many tokens, admitted by a process
--                     on its own (fail_mode "local") while Redis failed, so that its return to the shared
--                     bucket is not a second burst. A debit may put the bucket in debt, down to −capacity.
-- ARGV[5]  now_ms     optional; when absent the Redis server's TIME is used
--
-- Reply: { accepted, remaining, 0, reset_after_ms }
--   accepted        whole tokens actually added (what would overflow the capacity is dropped); 0 for a debit
--   remaining       whole tokens in the bucket afterwards (0 in debt)
--   reset_after_ms  ms until the bucket is full again; -1 when never (rate 0)
-- A missing key is a full bucket: nothing can be added to it. Mirrors src/algorithm/token_bucket.rs.

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
local n = tonumber(ARGV[4])
local now_arg = 5
if not (capacity and rate and per and n) or capacity < 1 or rate < 0 or per < 1 then
  return redis.error_reply('ERR token_return: bad arguments (capacity, rate, per_ms, tokens)')
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
  if n >= 0 then return { 0, capacity, 0, 0 } end
  level, ts = full, now
end
if old_per and old_per ~= per and old_per > 0 then level = idiv(level * per, old_per) end
if now > ts then
  level = level + (now - ts) * rate
  ts = now
end
if level > full then level = full end

local accepted = 0
if n >= 0 then
  local before = idiv(level, per)
  level = level + n * per
  if level > full then level = full end
  accepted = idiv(level, per) - before
else
  -- Not below -capacity, nor below where it was (token_acquire.lua's debt may be deeper): a debit never adds.
  local floor = -full
  if level < floor then floor = level end
  level = level + n * per
  if level < floor then level = floor end
end

local reset_after = 0
if level >= full then
  redis.call('DEL', KEYS[1])
else
  if rate == 0 then reset_after = -1 else reset_after = cdiv(full - level, rate) end
  redis.call('HSET', KEYS[1], 'level', int(level), 'ts', int(ts), 'per', int(per))
  if rate == 0 then redis.call('PERSIST', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], int(reset_after)) end
end
local remaining = idiv(level, per)
if remaining < 0 then remaining = 0 end -- still in debt
return { accepted, remaining, 0, reset_after }
