"""A real gRPC client of Envoy's Rate Limit Service (RLS v3), for cli/tests/rls.rs.

It speaks to `tokenlease serve --grpc-listen` with grpcio and the stubs of Envoy's data-plane API that the gRPC
authors publish on PyPI (xds-protos), as a gateway of another ecosystem would. It knows nothing of tokenlease.

Usage: rls_client.py HOST:PORT < requests.json, where requests.json is a list of
  {"domain": str, "hits_addend": int?, "descriptors": [{"entries": [[key, value], ...], "hits_addend": int?}]}
It prints one JSON line per request: the response (enum values by name, durations in milliseconds, the headers
to add as an object), or {"error": STATUS_CODE_NAME, "details": str} when the call failed.
"""

import json
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

Response = rls_pb2.RateLimitResponse


def request(spec):
    descriptors = []
    for d in spec["descriptors"]:
        descriptor = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in d["entries"]]
        )
        if "hits_addend" in d:
            descriptor.hits_addend.value = d["hits_addend"]
        descriptors.append(descriptor)
    return rls_pb2.RateLimitRequest(
        domain=spec["domain"], descriptors=descriptors, hits_addend=spec.get("hits_addend", 0)
    )


def answer(response):
    statuses = []
    for s in response.statuses:
        status = {"code": Response.Code.Name(s.code), "limit_remaining": s.limit_remaining}
        if s.HasField("current_limit"):
            status["current_limit"] = {
                "name": s.current_limit.name,
                "requests_per_unit": s.current_limit.requests_per_unit,
                "unit": Response.RateLimit.Unit.Name(s.current_limit.unit),
            }
        if s.HasField("duration_until_reset"):
            status["duration_until_reset_ms"] = s.duration_until_reset.ToMilliseconds()
        statuses.append(status)
    return {
        "overall_code": Response.Code.Name(response.overall_code),
        "statuses": statuses,
        "headers": {h.key: h.value for h in response.response_headers_to_add},
    }


def main():
    specs = json.load(sys.stdin)
    with grpc.insecure_channel(sys.argv[1]) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for spec in specs:
            try:
                out = answer(stub.ShouldRateLimit(request(spec), timeout=30))
            except grpc.RpcError as e:
                out = {"error": e.code().name, "details": e.details()}
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
