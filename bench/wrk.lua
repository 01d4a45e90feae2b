-- wrk script for one endpoint, or the challenge's mix, with every response checked.
--
--   wrk -c64 -d10s -s bench/wrk.lua http://127.0.0.1:3000 -- <kind> <tokens file> <posts>
--
-- kind: feed | post | like | create | mix | ceiling. The tokens file has one JWT per line.
-- A response counts as bad when its status or the start of its body is not what the kind expects;
-- done() prints one JSON line with the counts and the latency percentiles.

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local kind, tokens, posts
-- Globals, so done() can read them from every thread with thread:get().
bad, bad_example = 0, ""

-- The k6 loop: per user loop one feed, one post, a like 15% of the time, a post 2% of the time.
local MIX = { { "feed", 1 }, { "post", 1 }, { "like", 0.15 }, { "create", 0.02 } }
local MIX_TOTAL = 2.17

local EXPECT = {
  feed = { 200, '{"posts":[{"id":' },
  ceiling = { 200, '{"posts":[{"id":' },
  post = { 200, '{"post":{"id":' },
  like = { 201, '{"liked":true,' }, -- or 200 when a random pair was liked before
  create = { 201, '{"post":{"id":' },
}

function init(args)
  kind, posts = args[1], tonumber(args[3] or "500000")
  tokens = {}
  for line in io.lines(args[2]) do tokens[#tokens + 1] = line end
  math.randomseed(os.time() + tonumber(tostring(tokens):sub(8), 16) % 100000)
end

local function token() return "Bearer " .. tokens[math.random(#tokens)] end
local counter = 0

local build = {
  feed = function() return wrk.format("GET", "/feed") end,
  ceiling = function() return wrk.format("GET", "/feed") end,
  post = function() return wrk.format("GET", "/posts/" .. math.random(posts)) end,
  like = function()
    return wrk.format("POST", "/posts/" .. math.random(posts) .. "/like", { Authorization = token() })
  end,
  create = function()
    counter = counter + 1
    local body = '{"body":"Benchmark post ' .. counter .. ' from wrk."}'
    return wrk.format("POST", "/posts", { Authorization = token(), ["Content-Type"] = "application/json" }, body)
  end,
}

function request()
  if kind ~= "mix" then return build[kind]() end
  local r = math.random() * MIX_TOTAL
  for _, entry in ipairs(MIX) do
    r = r - entry[2]
    if r <= 0 then return build[entry[1]]() end
  end
  return build.feed()
end

local function expected(status, body)
  if kind == "mix" then
    for _, e in pairs(EXPECT) do
      if (status == e[1] or (e[1] == 201 and status == 200)) and body:sub(1, #e[2]) == e[2] then return true end
    end
    return false
  end
  local e = EXPECT[kind]
  if kind == "like" and status == 200 then status = 201 end
  return status == e[1] and body:sub(1, #e[2]) == e[2]
end

function response(status, headers, body)
  if not expected(status, body) then
    bad = bad + 1
    if bad_example == "" then
      -- Made safe to print inside a JSON string.
      bad_example = (status .. " " .. body:sub(1, 80)):gsub("%c", " "):gsub("\\", "\\\\"):gsub('"', '\\"')
    end
  end
end

function done(summary, latency, requests)
  local total_bad, example = 0, ""
  for _, thread in ipairs(threads) do
    total_bad = total_bad + thread:get("bad")
    if example == "" then example = thread:get("bad_example") end
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"bad":%d,"bad_example":"%s","non2xx":%d,"socket_errors":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, total_bad, example, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
