-- token_return.lua — give leased but unused tokens back to a token bucket, capped at its capacity.
--
-- KEYS[1]  the bucket (same hash as token_bucket.lua: level = tokens × per_ms, ts, per, capacity, rate)
-- KEYS[2]  optional: the call's mark, `<bucket>:return:<id>` with an id unique to this call. A call whose mark
--          exists was applied already (its reply was lost, say, to a connection dropped after the script ran and
--          retried) and is not applied again: the reply gives what it added then, and the bucket as it is now. A
--          give-back applied sets its mark to the tokens it added for mark_ms (its retries).
-- ARGV[1]  capacity   tokens, integer ≥ 1
-- ARGV[2]  rate       tokens per `per_ms`, integer ≥ 0
-- ARGV[3]  per_ms     integer ≥ 1
-- ARGV[4]  tokens     tokens given back, integer ≥ 0
-- ARGV[5]  now_ms     optional; when absent the Redis server's TIME is used
-- With the mark:
-- ARGV[5]  mark_ms    integer ≥ 0: how long the mark is kept, longer than the call and its retries may take; 0:
--                     10 s (until 2026-11-28 this argument was a debit's hold, when a negative count charged the
--                     bucket with what fail_mode "local" sold alone; nothing is sold on credit any more)
-- ARGV[6]  since      the leases the tokens given back came from, each named by its stamp (token_lease.lua's
--                     fifth integer): `stamp:tokens` pairs joined by commas, their tokens summing to ARGV[4]; or
--                     one stamp, all the tokens that lease's; -1 when none (a caller that keeps no stamps)
-- ARGV[7]  now_ms     optional, as above
-- ARGV[6], or ARGV[8] with the mark: adopted_ms, optional, after now_ms (then given, or empty for TIME): when the
--          caller adopted these parameters, ms since the Unix epoch (absent: 0); lib/bucket.lua's load_bucket
--          decides a call adopted before the hash's `adopted` with the hash's parameters
--
-- Reply: { accepted, remaining, 0, reset_after_ms }
--   accepted        whole tokens actually added (what would overflow the capacity, less the tokens paced leases
--                   have yet to release, is dropped; with `since`, each lease's tokens at most the lowest room
--                   the bucket had at a change after its stamp, note_room: tokens the refill replaced while they
--                   were out count once)
--   remaining       whole tokens in the bucket afterwards (0 in debt)
--   reset_after_ms  ms until the bucket is full again; -1 when never (rate 0)
-- A missing key is a full bucket: nothing can be added to it. The time since the last call refills at the
-- parameters the hash records, then the level is converted to this call's, as in token_bucket.lua (invariant 11).
-- Mirrors src/algorithm/token_bucket.rs, which gives the same replies and stores the same state.

local capacity, rate, per, n = numbers(1, 4)
local mark_ms, since = 0, '-1'
local now_arg = 5
if KEYS[2] then mark_ms, since, now_arg = numbers(5, 5), ARGV[6] or '-1', 7 end
-- `lent`: { stamp, tokens } of each lease named, nil when none.
local lent, sum = nil, n
if tonumber(since) then
  if tonumber(since) >= 0 then lent = { { tonumber(since), n } } end
else
  lent, sum = {}, 0
  for m, k in string.gmatch(since, '(%d+):(%d+)') do
    lent[#lent + 1] = { tonumber(m), tonumber(k) }
    sum = sum + tonumber(k)
  end
end
if not (capacity and rate and per and n and mark_ms) or capacity < 1 or rate < 0 or per < 1 or n < 0
    or mark_ms < 0 or sum ~= n or (lent and #lent == 0) then
  return redis.error_reply('ERR token_return: bad arguments (capacity, rate, per_ms, tokens, [mark_ms, since])')
end
if mark_ms == 0 then mark_ms = 10000 end
local mark = KEYS[2]
local now, level, ts, pend, noted, held, adopted, full, missing, _
now, level, ts, _, pend, noted, held, capacity, rate, per, adopted, full, missing =
  open_bucket(KEYS[1], capacity, rate, per, now_arg)
local added = mark and tonumber(redis.call('GET', mark))
if missing then
  -- Nothing to add to a full bucket; the mark still says so, or a retry after a take would add.
  if mark and not added then redis.call('SET', mark, '0', 'PX', int(mark_ms)) end
  return { added or 0, capacity, 0, 0 }
end
local function reply(accepted) -- remaining: 0 still in debt
  return { accepted, whole_tokens(level, per), 0, refill_ms(level, full, rate) }
end
if added then return reply(added) end -- applied already: nothing is written

local room = room_of(level, per, capacity, pend, held)
local before = idiv(level, per)
-- A give-back of leases' tokens lowers the rooms noted after each stamp by what that lease's tokens added.
local fills = nil
if lent then
  -- Each lease's tokens: at most the room now (less what the others added) and the lowest noted after its stamp
  -- (note_room); nothing when the notes do not reach back to it. The rooms noted after the stamp are then lower
  -- by what they added, so no other lease's tokens, in this give-back or a later one, fill the same room.
  local s = redis.call('HMGET', KEYS[1], 'rooms_from', 'rooms')
  local from = tonumber(s[1]) or 0
  local notes = {}
  for m, r in string.gmatch(s[2] or '', '(%d+):(%d+)') do notes[#notes + 1] = { tonumber(m), tonumber(r) } end
  fills, n = {}, 0
  for _, l in ipairs(lent) do
    local add = l[2]
    if add > room - n then add = room - n end
    if add < 0 or from == 0 or l[1] < from then add = 0 end
    for _, note in ipairs(notes) do
      if note[1] > l[1] and note[2] < add then add = note[2] end
    end
    for _, note in ipairs(notes) do
      if note[1] > l[1] then note[2] = note[2] - add end
    end
    n = n + add
    fills[#fills + 1] = { l[1], add }
  end
end
level = level + n * per
-- Up to the capacity, less what paced leases have yet to release (load_bucket).
if level > full - (pend + held) * per then level = full - (pend + held) * per end
local accepted = idiv(level, per) - before

save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted)
if noted then note_room(KEYS[1], room, false, now, fills) end
-- A give-back's mark need only outlive the retries of one call (a connection dropped after the script ran).
if mark then redis.call('SET', mark, int(accepted), 'PX', int(mark_ms)) end
return reply(accepted)
