-- make bench: the approval poll and the baseline (bench/baseline/, a server of its own),
-- one request per effect id in turn.
-- BENCH_MODE: baseline | poll | poll304; BENCH_TARGETS: a file of "effect_id etag" lines.
local mode = os.getenv("BENCH_MODE")
local auth = "Bearer " .. (os.getenv("BENCH_TOKEN") or "")
local targets = {}
for line in io.lines(os.getenv("BENCH_TARGETS")) do
  local id, etag = line:match("^(%S+)%s+(.+)$")
  targets[#targets + 1] = { id, etag }
end
local i = 0

function init(args)
  -- Each thread starts at another place in the list, so they do not poll in lockstep.
  i = math.random(#targets)
end

function request()
  i = i % #targets + 1
  local t = targets[i]
  if mode == "baseline" then
    return wrk.format("GET", "/baseline/" .. t[1])
  end
  local headers = { ["Authorization"] = auth }
  if mode == "poll304" then
    headers["If-None-Match"] = t[2]
  end
  return wrk.format("GET", "/api/v1/effects/" .. t[1], headers)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
