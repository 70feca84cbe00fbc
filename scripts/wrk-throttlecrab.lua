-- wrk script: POST /throttle to throttlecrab-server on one hot key with the limits of `sku_buy` (burst 2000,
-- 1000 per second), the request `scripts/wrk-check.lua` sends tokenlease.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"key": "sku:42", "max_burst": 2000, "count_per_period": 1000, "period": 1}'
