"""What a saved KV state depends on, and why a save's states do not fit this daemon.

A KV state is the model's computation over a conversation's tokens. It is right for another
daemon only if that daemon would have computed the same: the same weights (and tokenizer and
chat template, which live in the same file), the same KV cache types and llama.cpp's layout of
them, the same prompt layout (the tokens the messages become), the same context per
conversation. Anything else, and the conversation is rebuilt from its text, which is always right.

What is deliberately not in it: the CPU features a build was compiled for and the device the KV
lives on. A state is the same bytes whichever wrote it (values may differ in their last bits
between kernels, as they do between two batch shapes on one machine), so a save made on a
desktop's AVX-512 build resumes on a laptop's AVX2 one.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from sidecar.api.xlm.v1 import session_archive_pb2 as apb
from sidecar.backend.prompt_layout import PROMPT_LAYOUT_VERSION

MIB = 1 << 20
# Files up to this size are hashed whole (test models, small models: milliseconds).
WHOLE_FILE_BYTES = 32 * MIB
HEAD_BYTES = 8 * MIB  # the GGUF header: metadata, chat template, vocabulary, tensor table
SAMPLES = 16

_digests: dict[tuple[str, int, int], bytes] = {}
_lock = threading.Lock()


def model_digest(path: str | os.PathLike[str]) -> bytes:
    """SHA-256 over the model file's size, its header, 16 evenly spaced MiB of it and its last
    MiB (the whole file when small): about 25 MiB read, once per file (kept by path, size and
    modification time). Two files that differ in their metadata or in any sampled tensor differ
    here; a full fine-tune changes every tensor."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _digests:
            return _digests[key]
    h = hashlib.sha256(st.st_size.to_bytes(8, "little"))
    with open(p, "rb") as f:
        if st.st_size <= WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(4 * MIB), b""):
                h.update(block)
        else:
            h.update(f.read(HEAD_BYTES))
            step = (st.st_size - HEAD_BYTES - MIB) // SAMPLES
            for i in range(SAMPLES):
                f.seek(HEAD_BYTES + i * step)
                h.update(f.read(MIB))
            f.seek(st.st_size - MIB)
            h.update(f.read(MIB))
    digest = h.digest()
    with _lock:
        _digests[key] = digest
    return digest


def llama_build() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}"


def fingerprint(model_path: str | os.PathLike[str], *, model_name: str, context_per_session: int,
                kv_type: str, layers: int) -> apb.KvFingerprint:
    """This daemon's fingerprint. `layers`: the KV state's layer count (seq_state_check)."""
    return apb.KvFingerprint(
        model_digest=model_digest(model_path),
        model_bytes=os.path.getsize(model_path),
        model_name=model_name,
        context_per_session=context_per_session,
        kv_type_k=kv_type.upper(),
        kv_type_v=kv_type.upper(),
        prompt_layout_version=PROMPT_LAYOUT_VERSION,
        llama_build=llama_build(),
        layers=layers,
    )


def mismatch(saved: apb.KvFingerprint, ours: apb.KvFingerprint) -> str | None:
    """Why a state saved under `saved` cannot be restored here, or None when it can. Layers are
    not compared here: the model's digest decides, and a state's own layers were checked
    against its fingerprint when the archive was read (save_format.check_kv_layout)."""
    if saved.model_digest != ours.model_digest:
        return f"another model: saved with {saved.model_name or 'a model'} ({saved.model_bytes} bytes), this daemon serves {ours.model_name} ({ours.model_bytes} bytes)"
    if saved.context_per_session != ours.context_per_session:
        return f"context {ours.context_per_session} tokens per session, saved with {saved.context_per_session}"
    if (saved.kv_type_k, saved.kv_type_v) != (ours.kv_type_k, ours.kv_type_v):
        return f"KV cache type {ours.kv_type_k}, saved with {saved.kv_type_k}"
    if saved.prompt_layout_version != ours.prompt_layout_version:
        return f"prompt layout version {ours.prompt_layout_version}, saved with {saved.prompt_layout_version}"
    if saved.llama_build != ours.llama_build:
        return f"llama.cpp build {ours.llama_build}, saved with {saved.llama_build}"
    return None
