-- reset.lua — forget a key: its state (bucket, log, window counter or queue) and its ban.
--
-- KEYS[1]  the key's state, any algorithm's
-- KEYS[2]  its ban
-- ARGV[1]  none: reset takes no argument (a trailing one, such as the time the other scripts take, is ignored)
--
-- Reply: { 0, 0, 0, 0 }. A key with no state is full (or empty, for a window or a queue), so the next call starts
-- afresh.

redis.call('DEL', KEYS[1], KEYS[2])
return { 0, 0, 0, 0 }
