#!/usr/bin/env python3
"""Generate the Python gRPC code in sidecar/api/ from proto/. Never edit the output by hand.

Run: python scripts/gen_proto.py   (needs the dev extra: grpcio-tools)

The proto files live under proto/ so that other languages' clients can compile them as they are.
We map proto/ to the virtual import path `sidecar/api` so that the generated modules import each
other as `sidecar.api.xlm.v1...`, i.e. from inside our package, with no post-processing of the
generated text.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
VIRTUAL_ROOT = "sidecar/api"


def proto_files() -> list[str]:
    """The proto files as protoc must name them (under the virtual root)."""
    return sorted(f"{VIRTUAL_ROOT}/{p.relative_to(PROTO_ROOT).as_posix()}" for p in PROTO_ROOT.rglob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Write the generated modules under `out_root` (the repo root for the real thing) and return them."""
    from grpc_tools import protoc

    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={VIRTUAL_ROOT}={PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *proto_files(),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted(p for p in (out_root / VIRTUAL_ROOT).rglob("*_pb2*.py*"))


if __name__ == "__main__":
    for path in generate(REPO):
        print(path.relative_to(REPO))
    sys.exit(0)
