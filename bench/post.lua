-- wrk script: POSTs {"msgId":"<prefix>-<thread>-<n>"}; a share of the requests repeats
-- one of the thread's last 64 ids (so duplicates meet both in-flight and completed
-- markers). Ids are unique across threads and, with a fresh prefix, across runs. The id
-- also goes in an X-Msg-Id header, which the upstream logs cheaply (the proxies pass
-- headers on unchanged; nothing keys on it).
--   wrk -s bench/post.lua URL -- PREFIX SHARE        (SHARE: 0 = all unique, 0.5 = half)
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local prefix, share, n, recent = "r", 0, 0, {}

function init(args)
  prefix = args[1] or "r"
  share = tonumber(args[2] or "0")
  math.randomseed(tid * 7919)
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  local id
  if n > 0 and share > 0 and math.random() < share then
    id = recent[math.random(1, math.min(n, 64))]
  else
    n = n + 1
    id = prefix .. "-" .. tid .. "-" .. n
    recent[(n - 1) % 64 + 1] = id
  end
  return wrk.format("POST", nil, { ["X-Msg-Id"] = id }, '{"msgId":"' .. id .. '","text":"hello"}')
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d status_errors=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
