-- The same JSON body as begin.lua, to the bare echo handler.
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function request()
  counter = counter + 1
  local body = '{"key":"b' .. id .. '-' .. counter .. '"}'
  return wrk.format("POST", "/echo", { ["Content-Type"] = "application/json" }, body)
end
