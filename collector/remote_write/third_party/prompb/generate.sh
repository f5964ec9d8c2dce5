#!/bin/sh
# Regenerates types_pb2.py / remote_pb2.py (and their .pyi stubs) from Prometheus's own
# remote.proto and types.proto beside this script.  The generated modules are committed, so
# neither the build nor the install needs protoc.  Run with a grpcio-tools whose bundled
# protobuf has the runtime's major version (grpcio-tools 1.76.0: protoc 31.1, protobuf 6.x):
#   python -m venv /tmp/protogen && /tmp/protogen/bin/pip install grpcio-tools==1.76.0
#   PYTHON=/tmp/protogen/bin/python sh generate.sh
set -eu
cd "$(dirname "$0")"
"${PYTHON:-python3}" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. types.proto remote.proto
# protoc writes `import types_pb2`, a top-level module; inside this package it is relative.
for f in remote_pb2.py remote_pb2.pyi; do
    sed -i 's/^import types_pb2 as /from . import types_pb2 as /' "$f"
done
