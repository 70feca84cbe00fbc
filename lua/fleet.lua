-- fleet.lua — the roster of one rule: a member's beat, the live count, the hold after an outage, and what it
-- presumed of the members that never reported.
--
-- KEYS[1]  the roster (a sorted set: member → ms it was last heard)
-- KEYS[2]  the hold (a hash: epoch = ms the last hold started, its name; until = ms until which it waits for the
--          reports; refill = the longest refill_ms a member sent; presumed_epoch, presumed_ms, presumed_at = the
--          last presumption: the epoch of the hold that made it, its ms and when it was made)
-- KEYS[3]  who owes a report before the hold ends (a hash: member → its term, ms)
-- KEYS[4]  the live count each member was last answered, the divisor of its shares (a hash: member → count)
-- ARGV[1]  member      unique to a limiter for the life of its process
-- ARGV[2]  live_ms     a member heard within this is live
-- ARGV[3]  silent_ms   a member silent this long may have been cut off: a hold waits for its report
-- ARGV[4]  keep_ms     a member unheard this long is forgotten
-- ARGV[5]  hold_ms     how long a hold waits for the reports
-- ARGV[6]  back        1: this member's store calls failed since its last beat (it comes back from an outage)
-- ARGV[7]  settled     1: this member owes nothing of the rule (all it admitted alone is charged)
-- ARGV[8]  refill_ms   how long the slowest key this member decided takes to refill from empty; -1: sales alone
--                      are not presumed
-- ARGV[9]  cut_ms      back: how long this member's calls had failed; 0 otherwise
-- ARGV[10] leave       1: this member leaves the fleet (it shut down owing nothing)
-- ARGV[11] now_ms      optional; when absent the Redis server's TIME is used
--
-- Reply: { processes, hold_ms, presumed_epoch, presumed_ms }
--   processes       live members, this one included (unless it leaves), and while a hold waits, the members that
--                   owe it a report and are not live: they may still be there, cut off, each selling its share
--   hold_ms         how long the hold still waits for the reports from now, 0 when none runs
--   presumed_epoch  the epoch of the last hold that ended with members presumed; 0 when none is kept
--   presumed_ms     what they were presumed to have sold alone, in ms of refill (below); 0 when none
-- The first member back from an outage (or the first to join a fleet whose every member is silent) starts a hold
-- unless one runs: every member silent for silent_ms owes a report (and this one, unless settled), and no process
-- calls the rule's keys until each has reported or hold_ms has passed. A member that has not reported by then
-- may have exited with its debt: it is presumed to have sold its whole local share, 1/count of a full bucket and
-- of the refill while it was silent and through the hold, and its term is the time that takes to refill:
--   term = ceil((refill + min(now - heard, max(cut_ms, live_ms, outage) + silent_ms) + hold_ms) / count)
-- where outage is how long nobody at all was heard. Members unheard for keep_ms before anyone was last heard are
-- forgotten, so after an outage those there when it began are kept for this hold; the roster itself outlives the
-- last beat it heard by 60 keep_ms.
-- with refill the longest refill_ms any member sent. The terms of those still owing at the hold's end add up to the
-- presumption, which every process charges to each key of the rule before the key's next store call: a token
-- bucket presumed_ms × rate of tokens (the debit's mark named by the epoch applies it once), a leaky queue a wait
-- of presumed_ms. It is kept 2 × refill + presumed_ms (a bucket untouched that long would be full either way);
-- one made while an earlier one is kept adds that one's ms, so nobody misses the earlier.
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
-- When anyone was last heard, at most now (now on an empty roster): after an outage, about when it began.
local function last_heard()
  local top = redis.call('ZREVRANGE', roster, 0, 0, 'WITHSCORES')
  local at = tonumber(top[2]) or now
  if at > now then at = now end
  return at
end
-- Members unheard for keep_ms before anyone was last heard are forgotten (a hold keeps their terms): after an
-- outage, those that were there when it began are kept for the hold that presumes them.
for _, m in ipairs(redis.call('ZRANGEBYSCORE', roster, '-inf', '(' .. int(last_heard() - keep_ms))) do
  redis.call('ZREM', roster, m)
  redis.call('HDEL', counts, m)
end
local h = redis.call('HMGET', hold, 'epoch', 'until', 'refill', 'presumed_epoch', 'presumed_ms', 'presumed_at')
local epoch, hold_until, refill = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or -1
local presumed_epoch, presumed, presumed_at = tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0
if refill_ms > refill then refill = refill_ms end
local function keep_until() -- when the presumption is forgotten: two refills and its own ms after it was made
  if refill > 0 then return presumed_at + 2 * refill + presumed end
  return presumed_at + presumed
end
local function kept() return presumed > 0 and now < keep_until() end
if not kept() then presumed_epoch, presumed, presumed_at = 0, 0, 0 end
-- A hold whose wait has passed ends: the terms of those still owing become the presumption.
local function close()
  local left = redis.call('HGETALL', owing)
  if #left == 0 or hold_until > now then return end
  local sum = 0
  for i = 2, #left, 2 do sum = sum + tonumber(left[i]) end
  redis.call('DEL', owing)
  if sum > 0 then
    if kept() then sum = sum + presumed end
    presumed_epoch, presumed, presumed_at = epoch, sum, hold_until
  end
end
close()
local function holding() return redis.call('HLEN', owing) > 0 and hold_until > now end
if leave then
  redis.call('ZREM', roster, member)
  redis.call('HDEL', counts, member)
  redis.call('HDEL', owing, member)
end

-- A member that joins a fleet whose every member is silent comes after an outage too (or after the whole fleet
-- left): it may be the first to call when the store is back, before any of them.
local joins_silence = false
if not leave and not redis.call('ZSCORE', roster, member) and redis.call('ZCARD', roster) > 0 then
  -- Not after keep_ms of silence: a newcomer cannot tell an outage from a fleet that stopped, and starts cold.
  joins_silence = redis.call('ZCOUNT', roster, int(now - silent_ms), '+inf') == 0 and now - last_heard() < keep_ms
end
if (back or joins_silence) and not holding() then
  local outage = now - last_heard() -- how long the whole roster was silent
  -- What m is presumed to have sold alone if it never reports, in ms of refill (see above).
  local function term(m)
    if refill_ms < 0 then return 0 end
    local heard = tonumber(redis.call('ZSCORE', roster, m)) or now
    local bound = cut_ms
    if live_ms > bound then bound = live_ms end
    if outage > bound then bound = outage end
    local alone = now - heard
    if alone < 0 then alone = 0 end
    if alone > bound + silent_ms then alone = bound + silent_ms end
    local count = tonumber(redis.call('HGET', counts, m)) or 1
    if count < 1 then count = 1 end
    return cdiv(refill + alone + hold_ms, count)
  end
  redis.call('DEL', owing)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', roster, '-inf', '(' .. int(now - silent_ms))) do
    if m ~= member then redis.call('HSET', owing, m, int(term(m))) end
  end
  if not settled then redis.call('HSET', owing, member, int(term(member))) end
  if redis.call('HLEN', owing) > 0 then
    hold_until = now + hold_ms
    if now > epoch then epoch = now else epoch = epoch + 1 end
  end
end
if settled then redis.call('HDEL', owing, member) end
-- Everyone has reported: the hold ends at once, presuming nobody.
if redis.call('HLEN', owing) == 0 and hold_until > now then hold_until = now end
close()

-- The live members; answered with those owing a waiting hold a report that are not live (a newcomer first after
-- an outage divides its shares by them too: they may still be there, cut off). A member's count kept for its
-- presumed term is the live one, the smaller: should this answer be lost, the member divides by its own earlier
-- count, and a term over the smaller count charges more than it sold, never less.
local function live() return redis.call('ZCOUNT', roster, '(' .. int(now - live_ms), '+inf') end
local function counted(n)
  if holding() then
    for _, m in ipairs(redis.call('HKEYS', owing)) do
      local heard = tonumber(redis.call('ZSCORE', roster, m))
      if not heard or heard <= now - live_ms then n = n + 1 end
    end
  end
  return n
end
local processes
if leave then
  processes = counted(live())
else
  redis.call('ZADD', roster, int(now), member)
  local n = live()
  redis.call('HSET', counts, member, n)
  processes = counted(n)
end
redis.call('HSET', hold, 'epoch', int(epoch), 'until', int(hold_until), 'refill', int(refill),
  'presumed_epoch', int(presumed_epoch), 'presumed_ms', int(presumed), 'presumed_at', int(presumed_at))
-- The roster outlives the last beat it heard by 60 keep_ms (ROSTER_KEEPS in src/algorithm/fleet.rs).
local top = redis.call('ZREVRANGE', roster, 0, 0, 'WITHSCORES')
local last = (tonumber(top[2]) or 0) + 60 * keep_ms
if hold_until > last then last = hold_until end
if presumed > 0 and keep_until() > last then last = keep_until() end
for _, key in ipairs({ roster, hold, counts }) do redis.call('PEXPIRE', key, int(last - now)) end
local hold_left = 0
if holding() then
  redis.call('PEXPIRE', owing, int(last - now))
  hold_left = hold_until - now
end
return { processes, hold_left, presumed_epoch, presumed }
