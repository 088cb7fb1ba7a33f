"""Remote mode: the daemon keeps the game's API and forwards generation to an OpenAI-compatible
inference server (vLLM, llama.cpp's server) over HTTP."""

from sidecar.remote.backend import RemoteBackend, RemoteOptions

__all__ = ["RemoteBackend", "RemoteOptions"]
