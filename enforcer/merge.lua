-- sluice: merge other regions' counts of G-Counter windows into this
-- region's Redis, by element-wise maximum (Shapiro, Preguiça, Baquero and
-- Zawirski, "Conflict-free Replicated Data Types", SSS 2011: the G-Counter's
-- merge). A count never goes down, so a redelivered or reordered update
-- changes nothing, and the order of updates does not matter.
--
-- KEYS[i]   the window's hash of per-region counts
-- ARGV[1]   N; then 3 values per key i at 2+3*(i-1): region, count, and the
--           key's time to live in ms (to the window's end plus slack; a TTL
--           is only ever lengthened)
-- Returns the number of fields raised, as text.
local n = tonumber(ARGV[1])
local raised = 0
for i = 1, n do
  local a = 2 + 3 * (i - 1)
  local key, region, count, ttl = KEYS[i], ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local old = tonumber(redis.call('HGET', key, region)) or -1
  if count > old then
    redis.call('HSET', key, region, count)
    raised = raised + 1
  end
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < ttl then redis.call('PEXPIRE', key, ttl) end
end
return tostring(raised)
