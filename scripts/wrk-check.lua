-- wrk script: POST /v1/check for the rule in $RULE on one hot key, the flash-sale case.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format('{"rule": "%s", "key": "sku:42"}', os.getenv("RULE") or "sku_buy")
