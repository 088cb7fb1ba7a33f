"""The xlm.v1 API: generated protobuf and gRPC modules (from proto/, by scripts/gen_proto.py).

Import messages from here: `from sidecar.api import pb, rpc`.
"""

from sidecar.api.xlm.v1 import sidecar_pb2 as pb
from sidecar.api.xlm.v1 import sidecar_pb2_grpc as rpc

__all__ = ["pb", "rpc"]
