-- make bench: the write path. Each thread owns one connection and one run (BENCH_RUNS,
-- a file of run ids) and alternates: record a keyed effect call (201, action execute),
-- then complete that effect (200). Every POST carries an Idempotency-Key, as the
-- Python client sends one with every POST, unless BENCH_IDEMPOTENCY=0.
local auth = "Bearer " .. (os.getenv("BENCH_TOKEN") or "")
local idempotency = os.getenv("BENCH_IDEMPOTENCY") ~= "0"
local stamp = os.getenv("BENCH_STAMP") or tostring(os.time())
local runs = {}
for line in io.lines(os.getenv("BENCH_RUNS")) do
  runs[#runs + 1] = line
end
local threads = {}
local started = 0

function setup(thread)
  started = started + 1
  thread:set("run_id", runs[(started - 1) % #runs + 1])
  thread:set("tid", started)
  threads[#threads + 1] = thread
end

local pending = nil
local counter = 0
completed = 0
recorded = 0
failures = 0

function request()
  counter = counter + 1
  local headers = {
    ["Authorization"] = auth,
    ["Content-Type"] = "application/json",
  }
  if idempotency then
    headers["Idempotency-Key"] = string.format("bench-%s-%d-%d", stamp, tid, counter)
  end
  if pending then
    local body = string.format(
      '{"run_id": "%s", "attempt": 1, "outcome": "done", "result": {"sent": %d}}', run_id, counter)
    return wrk.format("POST", "/api/v1/effects/" .. pending .. "/complete", headers, body)
  end
  local body = string.format(
    '{"attempt": 1, "tool": "email.send", "kind": "effect", "key": "bench-%s-%d-%d",'
      .. ' "key_source": "intent", "args": {"to": "customer@example.com", "n": %d}}',
    stamp, tid, counter, counter)
  return wrk.format("POST", "/api/v1/runs/" .. run_id .. "/calls", headers, body)
end

function response(status, headers, body)
  if pending then
    pending = nil
    if status == 200 then completed = completed + 1 else failures = failures + 1 end
  elseif status == 201 then
    recorded = recorded + 1
    pending = body:match('"effect":%s*{%s*"id":%s*"([%x%-]+)"')
  else
    failures = failures + 1
  end
end

function done(summary, latency, requests)
  local c, r, f = 0, 0, 0
  for _, thread in ipairs(threads) do
    c = c + thread:get("completed")
    r = r + thread:get("recorded")
    f = f + thread:get("failures")
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p99_us": %d,'
      .. ' "completed": %d, "recorded": %d, "failures": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), c, r, f))
end
