"""The vision encoder in a process of its own, for encoders that run on the CPU.

On the CPU one screenshot takes the encoder tens of seconds (a SigLIP-class encoder at 896 px is
about 5 TFLOP). Run in the engine's loop, that stalls every other conversation for as long; run
on a thread, it cannot be stopped (libmtmd's encode is one native call with no abort hook). In a
child process it runs beside the decode loop on the threads the engine leaves it, and a cancelled
question kills it at once. The child needs no weights of the text model: libmtmd only reads its
vocabulary (marker tokens) and embedding width, so it loads the model vocabulary-only.

Encoders on a GPU stay in the engine's loop: there an encode takes milliseconds, and VLMOpt's rule
that the encoder's VRAM and the language phase's extra VRAM are never held at once needs the two
to take turns on one device.

Protocol, over the child's stdin and stdout: length-prefixed pickles, one request then one reply.
Only this module's own parent and child speak it (both are this program), so pickle is safe here.

    python -m sidecar.vision.encode_worker     (frozen builds: `xlm-sidecar _vision-worker`)
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from sidecar.vision.encoder_settings import EncoderSettings
from sidecar.vision.image_input import RgbImage

WORKER_COMMAND = "_vision-worker"
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class EncodeRequest:
    model_path: Path
    text_n_embd: int  # the child loads the text model vocabulary-only, which has no widths
    settings: EncoderSettings  # its `threads` are the threads the engine leaves the encoder now
    image: RgbImage


@dataclass(frozen=True)
class EncodeFailed:
    """An error raised in the child, re-raised in the parent as the same SidecarError class."""

    kind: str
    message: str


def write_message(stream: BinaryIO, message: object) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def read_message(stream: BinaryIO) -> object:
    """The next message, or EOFError when the other side has gone."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("the other side closed the pipe")
    (length,) = _LENGTH.unpack(header)
    payload = stream.read(length)
    if len(payload) < length:
        raise EOFError("the other side closed the pipe mid-message")
    return pickle.loads(payload)


def worker_command() -> list[str]:
    """How to start the child: the same interpreter (or frozen binary) as this process."""
    if getattr(sys, "frozen", False):
        return [sys.executable, WORKER_COMMAND]
    return [sys.executable, "-m", "sidecar.vision.encode_worker"]


class _Child:
    """The child's state: the vocabulary-only text model, and the encoder while it is resident."""

    def __init__(self) -> None:
        self._model = None
        self._model_path: Path | None = None
        self._encoder = None

    def encode(self, request: EncodeRequest):
        from sidecar.vision.encoder import VisionEncoder  # the child only: the parent never loads it

        model = self._vocabulary(request.model_path)
        settings = request.settings
        if self._encoder is not None and self._encoder.settings != settings:
            self._encoder.close()
            self._encoder = None
        encoder = self._encoder or VisionEncoder(model, settings, request.text_n_embd)
        if settings.resident:
            self._encoder = encoder  # llama.cpp's own tools keep it loaded; VLMOpt does not
        encoded = encoder.encode(request.image)
        return encoded, replace(encoder.stats)

    def _vocabulary(self, path: Path) -> int:
        import llama_cpp

        if self._model is not None and self._model_path == path:
            return self._model
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
        self._model_path = path
        if not self._model:
            from sidecar.errors import ModelLoadError

            raise ModelLoadError(f"the vision worker could not read the vocabulary of {path}")
        return self._model


def serve(requests: BinaryIO, replies: BinaryIO) -> int:
    """Answer encode requests until the parent closes the pipe."""
    from sidecar.errors import SidecarError

    child = _Child()
    while True:
        try:
            request = read_message(requests)
        except EOFError:
            return 0
        try:
            reply: object = child.encode(request)
        except SidecarError as e:
            reply = EncodeFailed(type(e).__name__, str(e))
        except Exception as e:  # reported to the request, never a dead worker
            reply = EncodeFailed("EngineFailure", f"vision worker: {type(e).__name__}: {e}")
        write_message(replies, reply)


def main() -> int:
    # The replies own stdout; llama.cpp's log lines and anything printed go to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    # Run the module under its real name, so the classes in replies unpickle in the parent.
    from sidecar.vision.encode_worker import main as worker_main

    sys.exit(worker_main())
