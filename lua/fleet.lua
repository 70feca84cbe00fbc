-- fleet.lua — the roster of one rule: a member's beat, the live count, and the hold after an outage.
--
-- KEYS[1]  the roster (a sorted set: member → ms it was last heard)
-- KEYS[2]  the hold (a hash: until = ms before which no process leases or calls the rule's keys; epoch = holds
--          started so far)
-- KEYS[3]  who owes a report before the hold ends (a set of members)
-- ARGV[1]  member      unique to a limiter for the life of its process
-- ARGV[2]  live_ms     a member heard within this is live
-- ARGV[3]  silent_ms   a member silent this long may have been cut off: a hold waits for its report
-- ARGV[4]  keep_ms     a member unheard this long is forgotten
-- ARGV[5]  hold_ms     the longest a hold lasts
-- ARGV[6]  back        1: this member's store calls failed since its last beat (it comes back from an outage)
-- ARGV[7]  settled     1: this member owes nothing of the rule (all it admitted alone is charged)
-- ARGV[8]  now_ms      optional; when absent the Redis server's TIME is used
--
-- Reply: { processes, owing, hold_ms, epoch }
--   processes  live members, this one included
--   owing      members the hold still waits for
--   hold_ms    how long the hold lasts from now, 0 when none
--   epoch      holds started so far
-- The first member back from an outage (or the first to join a fleet whose every member is silent) starts a hold
-- unless one runs: every member silent for silent_ms owes a
-- report (and this one, unless settled); the hold ends when all have reported or hold_ms has passed.
-- Mirrors Roster::beat in src/algorithm/fleet.rs, which gives the same replies and stores the same state.

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'

local member = ARGV[1]
local live_ms, silent_ms, keep_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local hold_ms, back, settled = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
if not (member and live_ms and silent_ms and keep_ms and hold_ms) or member == '' or live_ms < 0 or silent_ms < 0
    or keep_ms < 1 or hold_ms < 0 then
  return redis.error_reply('ERR fleet: bad arguments (member, live_ms, silent_ms, keep_ms, hold_ms, back, settled)')
end
local now_arg = 8
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

local roster, hold, owing = KEYS[1], KEYS[2], KEYS[3]
redis.call('ZREMRANGEBYSCORE', roster, '-inf', '(' .. int(now - keep_ms))
local hold_until = tonumber(redis.call('HGET', hold, 'until') or '0') or 0
local epoch = tonumber(redis.call('HGET', hold, 'epoch') or '0') or 0
-- Members forgotten owe nothing.
for _, m in ipairs(redis.call('SMEMBERS', owing)) do
  if not redis.call('ZSCORE', roster, m) then redis.call('SREM', owing, m) end
end

-- A member that joins a fleet whose every member is silent comes after an outage too (or after the whole fleet
-- left): it may be the first to call when the store is back, before any of them.
local joins_silence = false
if not redis.call('ZSCORE', roster, member) and redis.call('ZCARD', roster) > 0 then
  joins_silence = redis.call('ZCOUNT', roster, int(now - silent_ms), '+inf') == 0
end
if (back or joins_silence) and hold_until <= now then
  redis.call('DEL', owing)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', roster, '-inf', '(' .. int(now - silent_ms))) do
    if m ~= member then redis.call('SADD', owing, m) end
  end
  if not settled then redis.call('SADD', owing, member) end
  if redis.call('SCARD', owing) > 0 then
    hold_until = now + hold_ms
    epoch = epoch + 1
  end
end
if settled then redis.call('SREM', owing, member) end
local left = redis.call('SCARD', owing)
if hold_until > now and left == 0 then hold_until = now end
if hold_until <= now then
  redis.call('DEL', owing)
  left = 0
end

redis.call('ZADD', roster, int(now), member)
redis.call('HSET', hold, 'until', int(hold_until), 'epoch', int(epoch))
local last = now + keep_ms
if hold_until > last then last = hold_until end
redis.call('PEXPIRE', roster, int(last - now))
redis.call('PEXPIRE', hold, int(last - now))
if left > 0 then redis.call('PEXPIRE', owing, int(last - now)) end
local processes = redis.call('ZCOUNT', roster, '(' .. int(now - live_ms), '+inf')
local hold_left = hold_until - now
if hold_left < 0 then hold_left = 0 end
return { processes, left, hold_left, epoch }
