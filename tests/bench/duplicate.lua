-- wrk script: POST the same msgId over and over (the duplicate path: one claim that
-- finds COMPLETED, answered without touching the upstream).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"msgId":"bench-duplicate","content":"hello"}'
