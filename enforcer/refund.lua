-- sluice: give back what decide.lua took from rules in this slot, when a
-- request spanning several Redis Cluster slots was denied in another slot.
-- Each rule's state is restored as if the request had not been counted,
-- clamped so that a refund never mints capacity beyond full.
--
-- KEYS[i]   state of rule i (only rules whose `took` was 1)
-- ARGV[1]   the `now` decide.lua used, ms
-- ARGV[2]   N; then the same 7 values per rule as decide.lua, except that a
--           sliding window's last value is the window decide.lua charged
-- ARGV[3+7N] this region's name: the field a g_counter rule took from
-- Returns N as text (the caller reads every reply as text).
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local region = ARGV[3 + 7 * n]
for i = 1, n do
  local a = 3 + 7 * (i - 1)
  local alg, limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local burst, cost = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local key = KEYS[i]
  if alg == 0 then
    local v = redis.call('GET', key)
    local t, ts, pd
    if v then t, ts, pd = string.match(v, '^(%d+) (%d+) (%d+)$') end
    if t and tonumber(pd) == period then
      t = math.min(burst * period, tonumber(t) + cost * period)
      redis.call('SET', key, string.format('%d %s %s', t, ts, pd), 'KEEPTTL')
    end
  elseif alg == 1 then
    local v = redis.call('GET', key)
    local ws, c, p, ts
    if v then ws, c, p, ts = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$') end
    local took = tonumber(ARGV[a + 6]) -- the window the cost went into
    if ws and tonumber(ws) == took then
      c = math.max(0, tonumber(c) - cost)
    elseif ws and tonumber(ws) == took + period then -- it has become the previous window since
      p = math.max(0, tonumber(p) - cost)
    else
      ws = nil
    end
    if ws then
      redis.call('SET', key, string.format('%s %d %d %s', ws, c, p, ts), 'KEEPTTL')
    end
  elseif alg == 2 then
    local c = tonumber(redis.call('GET', key))
    if c then
      redis.call('SET', key, string.format('%d', math.max(0, c - cost)), 'KEEPTTL')
    end
  elseif alg == 4 then
    -- This region's own count only, which no other region writes here. Other
    -- regions that already merged the higher count keep it (a maximum never
    -- goes down): they over-count by this refund until this region's count
    -- passes it again, never under-count.
    local c = tonumber(redis.call('HGET', key, region))
    if c then
      redis.call('HSET', key, region, math.max(0, c - cost))
    end
  else
    redis.call('ZREM', key, ARGV[a + 6])
  end
end
return tostring(n)
