-- sluice: give back what decide.lua took from rules in this slot, when a
-- request spanning several Redis Cluster slots was denied in another slot.
-- Each rule's state is restored as if the request had not been counted,
-- clamped so that a refund never mints capacity beyond full.
--
-- KEYS[i]   state of rule i (only rules whose `took` was 1)
-- ARGV[1]   the `now` decide.lua used, ms
-- ARGV[2]   N; then the same 7 values per rule as decide.lua, except that a
--           sliding window's last value is the window decide.lua charged
-- Returns N as text (the caller reads every reply as text).
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
for i = 1, n do
  local a = 3 + 7 * (i - 1)
  local alg, limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local burst, cost = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local key = KEYS[i]
  if alg == 0 then
    local v = redis.call('HMGET', key, 't', 'pd')
    local t, pd = tonumber(v[1]), tonumber(v[2])
    if t and pd == period then
      t = math.min(burst * period, t + cost * period)
      redis.call('HSET', key, 't', string.format('%d', t))
    end
  elseif alg == 1 then
    local v = redis.call('HMGET', key, 'w', 'c', 'p')
    local ws, c, p = tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0
    local took = tonumber(ARGV[a + 6]) -- the window the cost went into
    if ws == took then
      redis.call('HSET', key, 'c', string.format('%d', math.max(0, c - cost)))
    elseif ws == took + period then -- it has become the previous window since
      redis.call('HSET', key, 'p', string.format('%d', math.max(0, p - cost)))
    end
  elseif alg == 2 then
    local c = tonumber(redis.call('GET', key))
    if c then
      redis.call('SET', key, string.format('%d', math.max(0, c - cost)), 'KEEPTTL')
    end
  else
    redis.call('ZREM', key, ARGV[a + 6])
  end
end
return tostring(n)
