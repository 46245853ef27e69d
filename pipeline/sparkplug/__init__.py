"""Sparkplug B: its topic namespace (`topics`, standard library only, so the gateway can use it) and its payload,
the Eclipse Tahu reference `sparkplug_b.proto` vendored here with the module protoc generated from it
(`sparkplug_b_pb2`), decoded into one typed row per metric (`decode`).

The generated module was made with grpcio-tools 1.85 (protoc's Python generator 7.35.1) and checks at import that
the protobuf runtime is 7.x, at least 7.35.1 (`protobuf>=7.35.1,<8`, in the `lake` extra). To regenerate:

    cd pipeline/sparkplug && python -m grpc_tools.protoc --proto_path=. --python_out=. --pyi_out=. sparkplug_b.proto

The .proto is eclipse/tahu's `sparkplug_b/sparkplug_b.proto` at commit 46f25e79 (EPL-2.0, its header kept).
"""
