"""A GGUF model loaded through llama.cpp's C API: tokens in, text out, chat templates.

We use the C API (through llama-cpp-python's ctypes bindings), not `llama_cpp.Llama`: `Llama(...)`
silently ignores keyword arguments it does not know, hides multi-sequence batching, and the
executor of a later issue must set parameters `Llama` does not expose at all.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import structlog

from sidecar.native.chat_template import TemplateError, render_jinja_template
from sidecar.native.log_capture import capture_native_log
from sidecar.native.mapped_weights import FileMapping, file_mappings, release_copied_out
from sidecar.native.tensor_overrides import TensorOverrides
from sidecar.backend.contract import ModelFacts
from sidecar.errors import InvalidArgument, ModelLoadError

GGUF_MAGIC = b"GGUF"
log = structlog.get_logger("model")


def check_gguf_file(path: Path) -> None:
    """Raise ModelLoadError with a plain reason unless `path` is a readable GGUF file."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {path}")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {path}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF model (it starts with {magic!r}, not b'GGUF')")


class NativeModel:
    """Owns one llama_model; frees it on close(). Contexts are created on top of it by the engine."""

    def __init__(
        self,
        path: Path,
        *,
        n_gpu_layers: int = 0,
        tensor_overrides: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Load `path`. n_gpu_layers: whole layers to place on the GPU (before the overrides);
        tensor_overrides: (regex, "CPU" | ggml device name) pairs, first match wins."""
        check_gguf_file(path)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        overrides = TensorOverrides(tensor_overrides)
        params.tensor_buft_overrides = overrides.pointer
        self.path = path
        mapped_before = file_mappings(path)
        with capture_native_log() as load_log:
            self.ptr = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
        self.load_log = load_log
        if not self.ptr:
            raise ModelLoadError(
                f"llama.cpp could not load {path}: the file may be truncated, of an unsupported "
                "architecture, or not a language model (see the llama.cpp log lines above)"
            )
        # Bytes of the file's mapping given back because llama.cpp copied their weights out
        # (repacked, or on a GPU): what the mapped buffer no longer holds in RAM.
        self.released_mapped_bytes = self._release_copied_out(mapped_before)
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._piece_buf = ctypes.create_string_buffer(256)
        self.chat_template = self._meta("tokenizer.chat_template")

    def _release_copied_out(self, mapped_before: frozenset[FileMapping]) -> int:
        try:
            released = release_copied_out(self.path, mapped_before, self.load_log,
                                          int(llama_cpp.llama_model_n_layer(self.ptr)))
        except (OSError, ValueError) as e:  # a header our reader does not know: the weights stay twice
            log.warning("mapped weights not given back", path=str(self.path), error=str(e))
            return 0
        if released:
            log.info("gave back mapped weights llama.cpp copied out", mib=round(released / (1 << 20), 1))
        return released

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None

    # -- metadata ---------------------------------------------------------------------------------

    def _meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return ""
        if n >= len(buf):  # long chat templates: ask again with the exact size
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def facts(self) -> ModelFacts:
        arch = self._meta("general.architecture")
        return ModelFacts(
            path=str(self.path),
            name=self._meta("general.name") or self.path.stem,
            architecture=arch,
            parameters=int(llama_cpp.llama_model_n_params(self.ptr)),
            file_bytes=self.path.stat().st_size,
            trained_context=int(llama_cpp.llama_model_n_ctx_train(self.ptr)),
            layers=int(llama_cpp.llama_model_n_layer(self.ptr)),
            experts=int(self._meta(f"{arch}.expert_count") or 0),
            chat_template=self.chat_template,
        )

    @property
    def plain_kv(self) -> bool:
        """Its memory is one plain KV cache (no sliding window, no recurrent state): the only kind
        whose saved sequences carry into a context of another size (seq_state.py)."""
        arch = self._meta("general.architecture")
        recurrent = llama_cpp.llama_model_is_recurrent(self.ptr) or llama_cpp.llama_model_is_hybrid(self.ptr)
        return not recurrent and not self._meta(f"{arch}.attention.sliding_window")

    def kv_bytes_per_token_f16(self) -> int:
        """KV-cache bytes one token takes: K and V, every layer, one f16 vector of
        n_head_kv * head_dim each."""
        m = self.ptr
        head_dim = llama_cpp.llama_model_n_embd(m) // max(llama_cpp.llama_model_n_head(m), 1)
        return 2 * llama_cpp.llama_model_n_layer(m) * llama_cpp.llama_model_n_head_kv(m) * head_dim * 2

    # -- tokens -----------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
        """Tokens of `text`. `add_bos` adds the model's BOS only where the model wants one."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), out, capacity, add_bos and self.add_bos, parse_special
            )
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def check_token_ids(self, tokens: list[int]) -> None:
        """InvalidArgument for an id outside the vocabulary: llama.cpp would read past its tables."""
        bad = next((t for t in tokens if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise InvalidArgument(f"token id {bad} is not in the model's vocabulary of {self.n_vocab}")

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens`, control tokens written out (<|im_end|>), as /detokenize shows them."""
        self.check_token_ids(tokens)
        ids = (llama_cpp.llama_token * max(len(tokens), 1))(*tokens)
        capacity = 16 * len(tokens) + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = llama_cpp.llama_detokenize(self.vocab, ids, len(tokens), buf, capacity, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            capacity = -n

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes one token stands for. Control tokens (end of turn) render as nothing unless
        `special`."""
        # One buffer for every call: this runs for each token the engine streams.
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        return self._piece_buf.raw[:n] if n >= 0 else token_piece(self.vocab, token, special)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    # -- chat -------------------------------------------------------------------------------------

    def render_chat(self, messages: list[tuple[str, str]], *, add_assistant_prompt: bool = True) -> str:
        """Format messages with the model's own chat template.

        The template is the Jinja text in the GGUF, rendered in a sandbox, so it behaves as the
        model's authors wrote it (SmolLM2's adds its default system prompt, for instance).
        llama.cpp's built-in renderers are the fallback for templates Jinja cannot run. Raises
        InvalidArgument when the model has no template: then the caller must send a raw prompt.
        """
        if not self.chat_template:
            raise InvalidArgument("this model has no chat template; send a raw prompt instead of messages")
        try:
            return render_jinja_template(
                self.chat_template,
                messages,
                add_assistant_prompt=add_assistant_prompt,
                bos_token=self.special_text(llama_cpp.llama_vocab_bos(self.vocab)),
                eos_token=self.special_text(llama_cpp.llama_vocab_eos(self.vocab)),
            )
        except TemplateError:
            return self._render_builtin(messages, add_assistant_prompt)

    def special_text(self, token: int) -> str:
        """The text of a control token as templates write it (e.g. "<|im_end|>"); "" for none."""
        if token < 0:
            return ""
        return token_piece(self.vocab, token, True).decode("utf-8", errors="replace")

    def _render_builtin(self, messages: list[tuple[str, str]], add_assistant_prompt: bool) -> str:
        keep = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in messages]
        array = (llama_cpp.llama_chat_message * len(keep))(*[llama_cpp.llama_chat_message(r, c) for r, c in keep])
        template = self.chat_template.encode("utf-8")
        size = sum(len(r) + len(c) for r, c in keep) * 2 + 1024
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(template, array, len(keep), add_assistant_prompt, buf, size)
            if n < 0:
                raise InvalidArgument("this model's chat template cannot be rendered; send a raw prompt")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1
        raise InvalidArgument("chat template output did not fit")  # unreachable: second pass has room


def token_piece(vocab: object, token: int, special: bool) -> bytes:
    """The bytes one token of `vocab` stands for, however long; control tokens by their text when
    `special` (as templates and grammars read them), as nothing otherwise."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n
