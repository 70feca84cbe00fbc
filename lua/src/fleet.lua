-- fleet.lua — the roster of one rule: a member's beat and the live count, which divides a hot key's fair share of
-- the burst (invariant 17).
--
-- KEYS[1]  the roster (a sorted set: member → ms it was last heard)
-- ARGV[1]  member      unique to a limiter for the life of its process
-- ARGV[2]  live_ms     a member heard within this is live
-- ARGV[3]  keep_ms     a member unheard this long is forgotten
-- ARGV[4]  leave       1: this member leaves the fleet (it shut down)
-- ARGV[5]  now_ms      optional; when absent the Redis server's TIME is used
--
-- Reply: { processes, now_ms, 0, 0 }
--   processes       live members, this one included (unless it leaves)
--   now_ms          the time the script ran at (the server's TIME): a member compares it with its own clock, so
--                   that a step of the store's clock (a failover to a server whose clock differs) is seen
-- The roster expires keep_ms after the last beat it heard. (Until 2026-11-28 it also held the fleet after an
-- outage until every member had charged what it sold alone, in three more keys: `:hold`, `:owed`, `:counts`;
-- nothing is sold alone any more, and the keys an older process still writes expire by themselves.)
-- Mirrors Roster::beat in src/algorithm/fleet.rs, which gives the same replies and stores the same state.

local member = ARGV[1]
local live_ms, keep_ms = numbers(2, 3)
local leave = ARGV[4] == '1'
if not (member and live_ms and keep_ms) or member == '' or live_ms < 0 or keep_ms < 1 then
  return redis.error_reply('ERR fleet: bad arguments (member, live_ms, keep_ms, leave)')
end
local now_arg = 5
local now = now_of(now_arg)

local roster = KEYS[1]
redis.call('ZREMRANGEBYSCORE', roster, '-inf', '(' .. int(now - keep_ms))
if leave then
  redis.call('ZREM', roster, member)
else
  redis.call('ZADD', roster, int(now), member)
end
local processes = redis.call('ZCOUNT', roster, '(' .. int(now - live_ms), '+inf')
local top = redis.call('ZREVRANGE', roster, 0, 0, 'WITHSCORES')
if top[2] then
  local left = tonumber(top[2]) + keep_ms - now
  if left < 1 then left = 1 end
  redis.call('PEXPIRE', roster, int(left))
end
return { processes, now, 0, 0 }
