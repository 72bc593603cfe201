"""The Open Inference Protocol over gRPC, as Triton serves it: `inference.GRPCInferenceService` and grpc.health.v1.

Messages and services are Triton's generated modules as tritonclient[grpc] ships them
(`tritonclient.grpc.service_pb2`, `model_config_pb2`; the health service's from grpcio-health-checking),
rather than a vendored .proto compiled at build time: they are the definitions tritonclient and
Triton themselves use, a build step and a generated-code check-in are avoided, and the package is
pinned with the rest of the serving path (requirements-serve.txt). The cost is tritonclient's
protobuf<7 pin. server.py builds the grpc.aio server, service.py and health.py hold the RPCs,
codec.py and wire.py the infer messages, calls.py each call's status, metrics and log line.
"""
