-- wrk script of the lakeFS random-read benchmark (benches/src/bin/randomread.rs),
-- after `lakectl abuse random-read`: each request stats a key picked uniformly
-- (with replacement) from a file of keys, one per line.
-- Arguments after `--`: <authorization> <keys file> <route> <seed>
--   route lakefs: GET /lakefs/repositories/demo/refs/main/objects/stat?path=<key>
--   route native: GET /api/v1/repositories/demo/objects/stat?path=<key>
--   route list:   GET /lakefs/repositories/demo/refs/main/objects/ls?prefix=<dir>/&amount=1000,
--                 <dir> the directory of a random key (a page of up to 1,000 objects)
-- At the end it prints `WRK_RESULT {json}`: the counts, and lakectl's latency
-- histogram (cumulative counts of answers within 1, 2, 5, ... 5000 ms).

local thread_id = 0
function setup(thread)
  thread:set("id", thread_id)
  thread_id = thread_id + 1
end

local headers, keys, route
local non_200 = 0

local function escape(s)
  return (s:gsub("[^%w%-%._~/]", function(c) return string.format("%%%02X", string.byte(c)) end))
end

function init(args)
  headers = { ["Authorization"] = args[1] }
  keys = {}
  for line in io.lines(args[2]) do
    keys[#keys + 1] = escape(line)
  end
  route = args[3]
  math.randomseed(tonumber(args[4]) * 1000 + id)
end

function request()
  local key = keys[math.random(#keys)]
  if route == "native" then
    return wrk.format("GET", "/api/v1/repositories/demo/objects/stat?path=" .. key, headers)
  elseif route == "list" then
    local dir = key:match("^(.*/)") or ""
    return wrk.format("GET", "/lakefs/repositories/demo/refs/main/objects/ls?amount=1000&prefix=" .. dir, headers)
  end
  return wrk.format("GET", "/lakefs/repositories/demo/refs/main/objects/stat?path=" .. key, headers)
end

function response(status, headers, body)
  if status ~= 200 then
    non_200 = non_200 + 1
  end
end

-- The share of answers within `ms`: the largest percentile not above it.
local function within(latency, ms)
  local lo, hi = 0.0, 100.0
  for _ = 1, 30 do
    local mid = (lo + hi) / 2
    if latency:percentile(mid) <= ms * 1000 then lo = mid else hi = mid end
  end
  return lo / 100
end

function done(summary, latency, requests)
  local e = summary.errors
  local buckets = { 1, 2, 5, 7, 10, 15, 25, 50, 75, 100, 250, 350, 500, 750, 1000, 5000 }
  local hist = {}
  for _, b in ipairs(buckets) do
    hist[#hist + 1] = string.format('"%d":%d', b, math.floor(within(latency, b) * summary.requests + 0.5))
  end
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"mean_us":%.1f,"p50_us":%d,' ..
    '"p99_us":%d,"max_us":%d,"histogram_ms":{%s}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(99), latency.max,
    table.concat(hist, ",")))
end
