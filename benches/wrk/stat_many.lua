-- wrk script of the overload measurement (scripts/overload.sh): each
-- request is `POST /api/v1/repositories/demo/objects/stat` with <paths>
-- random demo paths out of <objects> (64 such bodies per thread, in turn).
-- Arguments after `--`: <token> <paths> <objects> <seed>
-- At the end it prints `WRK_STATUS {"200":n,...}`: how many answers had
-- each status, summed over wrk's threads.

local threads = {}
function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

local headers, paths, objects

local function object_path(n)
  return string.format("datasets/%03d/part-%08d.parquet", n % 997, n)
end

-- Bodies are made once, in init: building 1,000 paths per request would
-- make wrk, not the server, the bottleneck on a 2-core machine.
local bodies = {}
local next_body = 0

function init(args)
  headers = {
    ["Authorization"] = "Bearer " .. args[1],
    ["Content-Type"] = "application/json",
  }
  paths = tonumber(args[2])
  objects = tonumber(args[3])
  math.randomseed(tonumber(args[4]) * 1000 + id)
  for b = 1, 64 do
    local p = {}
    for i = 1, paths do
      p[i] = '"' .. object_path(math.random(objects)) .. '"'
    end
    bodies[b] = '{"paths":[' .. table.concat(p, ",") .. ']}'
  end
end

function request()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", "/api/v1/repositories/demo/objects/stat", headers, bodies[next_body])
end

function response(status, headers, body)
  -- Globals, so done() can read them back through thread:get.
  local name = "c" .. status
  _G[name] = (_G[name] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    -- Each thread's counts, read back from its own Lua state.
    for status = 100, 599 do
      local n = thread:get("c" .. status)
      if n then total[status] = (total[status] or 0) + n end
    end
  end
  local parts = {}
  for status, n in pairs(total) do
    table.insert(parts, string.format('"%d":%d', status, n))
  end
  io.write('WRK_STATUS {' .. table.concat(parts, ",") .. '}\n')
  io.write(string.format('WRK_LATENCY {"p50_us":%d,"p99_us":%d,"max_us":%d,"duration_us":%d}\n',
    latency:percentile(50), latency:percentile(99), latency.max, summary.duration))
end
