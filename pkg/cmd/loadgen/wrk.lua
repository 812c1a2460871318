-- wrk script of "loadgen get": GET PREFIX..id with an id picked at random
-- from WRK_IDS_FILE, the headers in WRK_HEADERS ("Name: value" lines; kept
-- in the environment so secrets never reach a command line) and those that
-- follow the id on its line ("id<TAB>Name: value<TAB>..."; the identity
-- signed for that id's request), and one WRK_JSON line of results for
-- loadgen to parse.
local requests = {}
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

function init(args)
  local headers = {}
  for name, value in string.gmatch(os.getenv("WRK_HEADERS") or "", "([^:\n]+): ([^\n]*)") do
    headers[name] = value
  end
  local prefix = os.getenv("WRK_PATH_PREFIX") or "/"
  -- Requests are formatted once: request() then costs a table lookup.
  for line in io.lines(os.getenv("WRK_IDS_FILE")) do
    local id, own = line:match("^([^\t]*)\t?(.*)$")
    if #id > 0 then
      local h = headers
      if #own > 0 then
        h = {}
        for name, value in pairs(headers) do h[name] = value end
        for name, value in string.gmatch(own, "([^:\t]+): ([^\t]*)") do h[name] = value end
      end
      requests[#requests + 1] = wrk.format("GET", prefix .. id, h)
    end
  end
  math.randomseed(os.time() * 100 + (thread_id or 0))
end

function request()
  return requests[math.random(#requests)]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%.1f,"p99_us":%.1f,"max_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
