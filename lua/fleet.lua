-- fleet.lua — the roster of one rule: a member's beat, the live count, and the hold after an outage.
--
-- KEYS[1]  the roster (a sorted set: member → ms it was last heard)
-- KEYS[2]  the hold (a hash: until = ms until which the hold waits for the reports; presumed = the terms of the
--          members still owing, summed; epoch = holds started so far)
-- KEYS[3]  who owes a report before the hold ends (a hash: member → its term, ms)
-- KEYS[4]  the live count each member was last answered, the divisor of its shares (a hash: member → count)
-- ARGV[1]  member      unique to a limiter for the life of its process
-- ARGV[2]  live_ms     a member heard within this is live
-- ARGV[3]  silent_ms   a member silent this long may have been cut off: a hold waits for its report
-- ARGV[4]  keep_ms     a member unheard this long is forgotten
-- ARGV[5]  hold_ms     how long a hold waits for the reports
-- ARGV[6]  back        1: this member's store calls failed since its last beat (it comes back from an outage)
-- ARGV[7]  settled     1: this member owes nothing of the rule (all it admitted alone is charged)
-- ARGV[8]  refill_ms   how long the rule's slowest key takes to refill from empty; -1: sales alone are not presumed
-- ARGV[9]  cut_ms      back: how long this member's calls had failed; 0 otherwise
-- ARGV[10] leave       1: this member leaves the fleet (it shut down owing nothing)
-- ARGV[11] now_ms      optional; when absent the Redis server's TIME is used
--
-- Reply: { processes, owing, hold_ms, epoch }
--   processes  live members, this one included (unless it leaves)
--   owing      members the hold still waits for
--   hold_ms    how long the hold lasts from now, 0 when none
--   epoch      holds started so far
-- The first member back from an outage (or the first to join a fleet whose every member is silent) starts a hold
-- unless one runs: every member silent for silent_ms owes a report (and this one, unless settled). A member that
-- never reports may have exited with its debt: it is presumed to have sold its whole local share, 1/count of a
-- full bucket and of the refill while it was silent, and its term is the time the buckets take to refill that:
--   term = ceil((refill_ms + min(now - heard, max(cut_ms, live_ms) + silent_ms) + hold_ms) / count)
-- The hold lasts hold_ms, then the terms of those still owing; it ends as soon as nobody owes.
-- Mirrors Roster::beat in src/algorithm/fleet.rs, which gives the same replies and stores the same state.

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return idiv(a + b - 1, b) end -- ceil(a / b) for integers, b ≥ 1
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'

local member = ARGV[1]
local live_ms, silent_ms, keep_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local hold_ms, back, settled = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
local refill_ms, cut_ms, leave = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
if not (member and live_ms and silent_ms and keep_ms and hold_ms and refill_ms and cut_ms) or member == ''
    or live_ms < 0 or silent_ms < 0 or keep_ms < 1 or hold_ms < 0 or refill_ms < -1 or cut_ms < 0 then
  return redis.error_reply('ERR fleet: bad arguments (member, live_ms, silent_ms, keep_ms, hold_ms, back, settled, '
    .. 'refill_ms, cut_ms, leave)')
end
local now_arg = 11
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

local roster, hold, owing, counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- Members forgotten drop out of the count; a hold keeps their terms.
for _, m in ipairs(redis.call('ZRANGEBYSCORE', roster, '-inf', '(' .. int(now - keep_ms))) do
  redis.call('ZREM', roster, m)
  redis.call('HDEL', counts, m)
end
local hold_until = tonumber(redis.call('HGET', hold, 'until') or '0') or 0
local presumed = tonumber(redis.call('HGET', hold, 'presumed') or '0') or 0
local epoch = tonumber(redis.call('HGET', hold, 'epoch') or '0') or 0
local function forgive(m) -- m owes no report any more
  local term = tonumber(redis.call('HGET', owing, m))
  if term then
    presumed = presumed - term
    redis.call('HDEL', owing, m)
  end
end
local function holding() return redis.call('HLEN', owing) > 0 and hold_until + presumed > now end
if leave then
  redis.call('ZREM', roster, member)
  redis.call('HDEL', counts, member)
  forgive(member)
end

-- A member that joins a fleet whose every member is silent comes after an outage too (or after the whole fleet
-- left): it may be the first to call when the store is back, before any of them.
local joins_silence = false
if not leave and not redis.call('ZSCORE', roster, member) and redis.call('ZCARD', roster) > 0 then
  joins_silence = redis.call('ZCOUNT', roster, int(now - silent_ms), '+inf') == 0
end
if (back or joins_silence) and not holding() then
  -- What m adds to the hold if it never reports (see above).
  local function term(m)
    if refill_ms < 0 then return 0 end
    local heard = tonumber(redis.call('ZSCORE', roster, m)) or now
    local bound = cut_ms
    if live_ms > bound then bound = live_ms end
    local alone = now - heard
    if alone < 0 then alone = 0 end
    if alone > bound + silent_ms then alone = bound + silent_ms end
    local count = tonumber(redis.call('HGET', counts, m)) or 1
    if count < 1 then count = 1 end
    return cdiv(refill_ms + alone + hold_ms, count)
  end
  redis.call('DEL', owing)
  presumed = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', roster, '-inf', '(' .. int(now - silent_ms))) do
    if m ~= member then
      local t = term(m)
      redis.call('HSET', owing, m, int(t))
      presumed = presumed + t
    end
  end
  if not settled then
    local t = term(member)
    redis.call('HSET', owing, member, int(t))
    presumed = presumed + t
  end
  if redis.call('HLEN', owing) > 0 then
    hold_until = now + hold_ms
    epoch = epoch + 1
  end
end
if settled then forgive(member) end
if not holding() then
  -- Everyone has reported, or the terms of those who did not have passed: the hold ends.
  redis.call('DEL', owing)
  presumed = 0
  if hold_until > now then hold_until = now end
end

local processes
if leave then
  processes = redis.call('ZCOUNT', roster, '(' .. int(now - live_ms), '+inf')
else
  redis.call('ZADD', roster, int(now), member)
  processes = redis.call('ZCOUNT', roster, '(' .. int(now - live_ms), '+inf')
  redis.call('HSET', counts, member, processes)
end
redis.call('HSET', hold, 'until', int(hold_until), 'presumed', int(presumed), 'epoch', int(epoch))
local left = redis.call('HLEN', owing)
local ends = hold_until + presumed
local last = now + keep_ms
if ends > last then last = ends end
for _, key in ipairs({ roster, hold, counts }) do redis.call('PEXPIRE', key, int(last - now)) end
if left > 0 then redis.call('PEXPIRE', owing, int(last - now)) end
local hold_left = 0
if left > 0 then hold_left = ends - now end
return { processes, left, hold_left, epoch }
