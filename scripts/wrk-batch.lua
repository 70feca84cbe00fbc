-- wrk script: POST /v1/check/batch with $BATCH checks (default 10) of the rule in $RULE on one hot key: the
-- flash-sale case, several decisions a round trip (a gateway deciding a request's limits at once, or a PHP
-- worker's queued calls).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = tonumber(os.getenv("BATCH") or "10")
local rule = os.getenv("RULE") or "sku_buy"
local checks = {}
for i = 1, n do
  checks[i] = string.format('{"rule": "%s", "key": "sku:42"}', rule)
end
wrk.body = '{"checks": [' .. table.concat(checks, ", ") .. ']}'
