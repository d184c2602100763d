-- sluice: check every matching token bucket, commit only if all allow.
--
-- Token bucket with lazy refill (no timers), in integer units so that refill
-- over periods that do not divide evenly is exact: one token is `period`
-- units, and a bucket gains `limit` units per millisecond, up to
-- burst*period units. Lua numbers are doubles, exact to 2^53; the enforcer
-- rejects rules whose burst*period or limit*period exceed 2^52.
--
-- KEYS[i]      bucket of rule i (hash: t = units, ts = ms of last refill)
-- ARGV[1]      now in ms since the epoch; "" or 0 = use Redis TIME
-- ARGV[2]      N, the number of rules; then per rule i, at 3+5*(i-1):
--              limit, period_ms, burst, cost, shadow (1 = shadow mode)
--
-- Returns {allowed, deny_index, wait_ms, shadow_index, now, rem_1..rem_N}
--   allowed      1 or 0 (shadow rules never make it 0)
--   deny_index   1-based index of the enforced rule that denied, 0 if none
--   wait_ms      ms until the denying rule has enough tokens; -1 when the cost
--                exceeds its capacity and waiting cannot help
--   shadow_index 1-based index of a shadow rule that would have denied, 0 if none
--   now          the time used, ms
--   rem_i        whole tokens left in rule i after the decision
local now = tonumber(ARGV[1])
-- TTL slack past the time to refill to full. With Redis TIME the TTL runs on
-- the same clock as the bucket: 1 s. A caller's clock (replays, tests) can
-- stand still while Redis's runs (a stalled replay), so its keys get 60 s.
local slack = 60000
if not now or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  slack = 1000
end
local n = tonumber(ARGV[2])
local units, stamps, needs = {}, {}, {}
local deny, wait, shadow = 0, 0, 0
for i = 1, n do
  local a = 3 + 5 * (i - 1)
  local limit, period, burst = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cost, isShadow = tonumber(ARGV[a + 3]), ARGV[a + 4] == '1'
  local cap = burst * period
  local v = redis.call('HMGET', KEYS[i], 't', 'ts')
  local t, ts = tonumber(v[1]), tonumber(v[2])
  if t == nil or ts == nil then
    t, ts = cap, now
  end
  if t > cap then t = cap end -- capacity lowered: clamp, never mint
  if now > ts then -- time never moves backwards: a stale now refills nothing
    t = math.min(cap, t + (now - ts) * limit)
    ts = now
  end
  units[i], stamps[i] = t, ts
  local need = cost * period
  needs[i] = need
  if t < need then
    local w
    if need > cap then w = -1 else w = math.ceil((need - t) / limit) end
    if isShadow then
      if shadow == 0 then shadow = i end
      needs[i] = 0 -- a shadow rule that would deny consumes nothing
    elseif deny == 0 then
      deny, wait = i, w
    end
  end
end
local out = {deny == 0 and 1 or 0, deny, wait, shadow, now}
for i = 1, n do
  local a = 3 + 5 * (i - 1)
  local limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local t = units[i]
  if deny == 0 then
    t = t - needs[i]
    redis.call('HSET', KEYS[i], 't', string.format('%d', t), 'ts', string.format('%d', stamps[i]))
    -- TTL: time to refill from empty to full, plus the slack.
    local full = math.ceil(tonumber(ARGV[a + 2]) * period / limit)
    redis.call('PEXPIRE', KEYS[i], full + slack)
  end
  out[5 + i] = math.floor(t / period)
end
return out
