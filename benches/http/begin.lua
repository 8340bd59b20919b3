-- One `begin` per request, every key new: POST /v1/bench/begin.
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function request()
  counter = counter + 1
  local body = '{"key":"b' .. id .. '-' .. counter .. '"}'
  return wrk.format("POST", "/v1/bench/begin", { ["Content-Type"] = "application/json" }, body)
end
