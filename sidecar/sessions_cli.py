"""`xlm-sidecar sessions export|import FILE`: save games from the command line, through a running
daemon (the same archives as ExportSessions and ImportSessions; README, "Save games").

    xlm-sidecar sessions export save.xlms [--session brom --session ilsa] [--kv]
    xlm-sidecar sessions import save.xlms [--replace]

The daemon never writes save files itself: the archive comes back to this process, which writes
it (atomically: a temporary file renamed over the target, so a crash never leaves half a save).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import grpc

from sidecar.budget import format_size


def register(sub: argparse._SubParsersAction) -> None:
    from sidecar.cli import _add_client_flags

    p = sub.add_parser("sessions", help="save NPCs' conversations to a file, or restore them (save games)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write sessions to FILE")
    export.add_argument("file", type=Path)
    export.add_argument("--session", action="append", default=[], help="a session id (repeatable); default: every session")
    export.add_argument("--kv", action="store_true", help="include their KV caches (large; resumes without recomputing)")
    _add_client_flags(export)
    export.set_defaults(run=_run_export)
    restore = actions.add_parser("import", help="restore the sessions in FILE")
    restore.add_argument("file", type=Path)
    restore.add_argument("--replace", action="store_true", help="overwrite sessions with the same ids")
    _add_client_flags(restore)
    restore.set_defaults(run=_run_import)


def _run_export(args: argparse.Namespace) -> int:
    from sidecar.cli import _client, _rpc_failure

    with _client(args) as client:
        try:
            saved = client.export_sessions(args.session or None, include_kv=args.kv)
        except grpc.RpcError as e:
            return _rpc_failure(e, client.address)
    folder = args.file.resolve().parent
    with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{args.file.name}.", delete=False) as tmp:
        tmp.write(saved.data)
        tmp.flush()
        os.fsync(tmp.fileno())
    os.replace(tmp.name, args.file)
    for s in saved.sessions:
        what = f"kv {format_size(s.kv_bytes)}" if s.restored == "kv" else (s.restored or "not saved")
        print(f"{s.session_id}\t{s.tokens} tokens\t{what}" + (f"\t({s.reason})" if s.reason else ""))
    print(f"wrote {args.file} ({format_size(len(saved.data))}, {sum(1 for s in saved.sessions if s.restored)} sessions)")
    return 0


def _run_import(args: argparse.Namespace) -> int:
    from sidecar.cli import _client, _rpc_failure

    try:
        data = args.file.read_bytes()
    except OSError as e:
        print(f"xlm-sidecar: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 1
    with _client(args) as client:
        try:
            infos = client.import_sessions(data, replace=args.replace)
        except grpc.RpcError as e:
            return _rpc_failure(e, client.address)
    for s in infos:
        print(f"{s.session_id}\t{s.tokens} tokens\trestored: {s.restored}" + (f"\t({s.reason})" if s.reason else ""))
    return 0
