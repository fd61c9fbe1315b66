-- wrk script of the HTTP benchmark (benches/src/bin/httpload.rs).
-- Arguments after `--`: <token> <route: kv|user> <keys> <seed>
--   kv:   GET /api/v1/kv/{pk} with pk uniformly random in 1..keys
--   user: GET /api/v1/user (no database work once the token is cached)
-- At the end it prints one line, `WRK_RESULT {json}`, for the Rust side.

local thread_id = 0
function setup(thread)
  thread:set("id", thread_id)
  thread_id = thread_id + 1
end

local headers, route, keys

function init(args)
  headers = { ["Authorization"] = "Bearer " .. args[1] }
  route = args[2]
  keys = tonumber(args[3])
  -- Each thread its own key stream (wrk's threads start with one seed).
  math.randomseed(tonumber(args[4]) * 1000 + id)
end

function request()
  if route == "user" then
    return wrk.format("GET", "/api/v1/user", headers)
  end
  return wrk.format("GET", string.format("/api/v1/kv/%020d", math.random(keys)), headers)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"mean_us":%.1f,"p50_us":%d,' ..
    '"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(99), latency.max))
end
