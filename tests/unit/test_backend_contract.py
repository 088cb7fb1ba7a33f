"""The backend contract (sidecar/backend/contract.py): a backend is `Backend` only; what needs the
model loaded in this process is `LocalModel`, asked for with `local_model`. The remote backend is no
LocalModel and pretends to be none: the service core itself refuses what needs one. The engine's
side is checked beside its other tests (test_embedding_slices.py: it needs a model loaded)."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.api import pb
from sidecar.backend.contract import Backend, LocalModel, local_model
from sidecar.budget import Budget
from sidecar.errors import Unimplemented
from sidecar.remote.backend import RemoteBackend, RemoteOptions
from sidecar.service.core import MODEL_ELSEWHERE, ServiceInfo, SidecarService


def test_the_remote_backend_is_no_local_model() -> None:
    """A remote backend has the contract and nothing else: what needs the model in this process
    (Tokenize, Detokenize, Embed, save games, a schedule) the service core refuses itself."""

    async def run() -> None:
        # Nothing listens on port 9: the backend starts anyway (the server may come up later).
        backend = await RemoteBackend.start(RemoteOptions(url="http://127.0.0.1:9/v1", model="m"))
        try:
            assert isinstance(backend, Backend) and not isinstance(backend, LocalModel)
            assert local_model(backend) is None and backend.snapshot().config is None
            for absent in ("config", "reload", "set_pass_limits", "call_model", "export_sessions"):
                assert not hasattr(backend, absent), absent
            service = SidecarService(backend, Budget(), ServiceInfo("test", (), 1 << 20))
            with pytest.raises(Unimplemented, match="remote mode forwards generations only") as refused:
                await service.tokenize(pb.TokenizeRequest(text="hi"))
            assert str(refused.value) == MODEL_ELSEWHERE
            with pytest.raises(Unimplemented):
                await service.embed(pb.EmbedRequest(input=["hi"]))
            with pytest.raises(Unimplemented, match="save games need the model served here"):
                await service.saves.export_bytes([], include_kv=False)
            status = await service.get_status()
            assert not status.HasField("schedule") and status.limits.max_sessions == 64
        finally:
            await backend.aclose()

    asyncio.run(run())
