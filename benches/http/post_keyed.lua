-- POST /orders with a new Idempotency-Key per request (through the proxy),
-- or the same requests straight to the upstream.
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function request()
  counter = counter + 1
  local headers = {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "p" .. id .. "-" .. counter,
  }
  return wrk.format("POST", "/orders", headers, '{"sku":"a","qty":1}')
end
