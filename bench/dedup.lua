-- The nginx + Lua + Redis dedup peer, written the way users write it (the seed
-- articles' recipe): SET NX EX on the message id, forward, SET COMPLETED on 2xx or DEL
-- on failure; a key already set is answered 200 "success" at once (also while the
-- first attempt is still running: that is what makes it lossy, and fast).
local redis = require "nginx.redis"

ngx.req.read_body()
local body = ngx.req.get_body_data() or ""
local id = body:match('"msgId":"([^"]+)"')
local upstream = ngx.var.dedup_upstream
if not id then
  return ngx.exec(upstream)
end

local red = redis:new()
red:set_timeouts(250, 250, 250)
local ok = red:connect("127.0.0.1", tonumber(ngx.var.redis_port))
if not ok then
  ngx.status = 503
  return ngx.print("store unavailable")
end
local key = "dedup:" .. id
local claimed = red:set(key, "PROCESSING", "NX", "EX", 30)
if claimed == ngx.null then
  red:set_keepalive(10000, 512)
  return ngx.print("success")
end
local res = ngx.location.capture(upstream, { method = ngx.HTTP_POST, body = body })
if res.status >= 200 and res.status < 300 then
  red:set(key, "COMPLETED", "EX", 86400)
else
  red:del(key)
end
red:set_keepalive(10000, 512)
ngx.status = res.status
ngx.print(res.body)
