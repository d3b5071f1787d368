-- wrk script: POST a JSON webhook with a fresh msgId every request (the "new message"
-- path: claim, forward, complete). Ids are unique across threads and runs.
local counter = 0
local prefix

function init(args)
  prefix = string.format("%x-%x", os.time(), math.random(0, 0x7fffffff))
end

function request()
  counter = counter + 1
  local body = string.format('{"msgId":"%s-%d","content":"hello"}', prefix, counter)
  return wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
end
