"""The vision encoder through libmtmd: an RGB image in, image embeddings for the text model out.

VLMOpt's first and third moves live here: with `resident=False` the encoder's weights are loaded
(to the GPU, when the plan says so) only for the encode and freed right after it, before the
language model decodes again, so the encoder holds no memory between images. With `resident=True`
it stays loaded, which is how llama.cpp's own tools run it; the benchmark compares the two.

Only one thread calls into this class (the engine's, or the vision worker's in its own process): libmtmd contexts are not thread-safe, and the
embeddings go straight into the engine's llama.cpp context afterwards.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np
import llama_cpp
from llama_cpp import mtmd_cpp

from sidecar.native.log_capture import capture_native_log
from sidecar.errors import EngineFailure, InvalidArgument, ModelLoadError
from sidecar.vision.encoder_settings import EncoderSettings
from sidecar.vision.image_input import RgbImage

_FLASH = {True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}
_CHUNK_TEXT = 0
_COMPUTE_BUFFER = re.compile(r"compute buffer size\s*=\s*([\d.]+)\s*MiB")


@dataclass(frozen=True)
class EncodedImage:
    """An image as the language model consumes it: text tokens the projector wants around the
    image (e.g. Gemma 3's <start_of_image>), then `n_tokens` embeddings.

    In the engine's token lists an image stands as `n_tokens` copies of `sentinel`, a negative id
    no vocabulary has and unique to the image's pixels, so prefix matching against a sequence's
    cache sees "this image is already there" exactly when it is.
    """

    image_id: str
    sentinel: int
    prefix_tokens: tuple[int, ...]
    suffix_tokens: tuple[int, ...]
    embeddings: np.ndarray = field(repr=False)  # (n_tokens, n_embd) float32
    non_causal: bool
    original_size: tuple[int, int]
    encoded_size: tuple[int, int]
    downscaled: bool
    encode_ms: float
    load_ms: float

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def span(self) -> list[int]:
        """The image's place in a prompt's token list."""
        return [*self.prefix_tokens, *([self.sentinel] * self.n_tokens), *self.suffix_tokens]


@dataclass
class EncoderStats:
    images_encoded: int = 0
    last_encode_ms: float = 0.0
    last_load_ms: float = 0.0
    compute_buffer_bytes: int = 0
    loaded: bool = False


def image_identity(image: RgbImage) -> tuple[str, int]:
    """A content hash of the pixels and the sentinel token id derived from it."""
    digest = hashlib.blake2b(image.pixels, digest_size=16, person=b"xlm-image")
    digest.update(f"{image.width}x{image.height}".encode())
    hex_id = digest.hexdigest()
    return hex_id, -(1 + int(hex_id[:8], 16) % (1 << 30))


class VisionEncoder:
    """Encodes images for one loaded text model. Recreate it when the text model is reloaded."""

    def __init__(self, model_ptr: int, settings: EncoderSettings, text_n_embd: int = 0) -> None:
        """`text_n_embd`: the text model's input width, for a model loaded vocabulary-only (which
        reports 0); by default it is read from the model."""
        self.settings = settings
        self._text_n_embd = text_n_embd or llama_cpp.llama_model_n_embd_inp(model_ptr)
        self.stats = EncoderStats()
        self._model_ptr = model_ptr
        self._image_size = settings.fixed_image_size
        self._patch_px = settings.patch_px
        self._ctx = None
        if settings.resident:
            self._ctx = self._open()

    def _open(self) -> int:
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = self.settings.use_gpu
        params.flash_attn_type = _FLASH[self.settings.flash_attention]
        params.n_threads = max(1, self.settings.threads)
        params.print_timings = False
        # llama.cpp's warm-up encodes a dummy image to size its buffers; the reservation that
        # follows sizes them anyway, and a warm-up would double the cost of every VLMOpt load.
        params.warmup = False
        if self.settings.image_max_tokens:
            params.image_max_tokens = self.settings.image_max_tokens
        t0 = time.perf_counter()
        with capture_native_log() as lines:
            ctx = mtmd_cpp.mtmd_init_from_file(os.fsencode(self.settings.projector_path), self._model_ptr, params)
        if not ctx:
            tail = " ".join(line.strip() for line in lines[-3:])
            raise ModelLoadError(f"libmtmd could not load the projector {self.settings.projector_path}: {tail}")
        self.stats.last_load_ms = (time.perf_counter() - t0) * 1000.0
        self.stats.loaded = True
        self._note_buffers(lines)
        return ctx

    def _note_buffers(self, lines: list[str]) -> None:
        sizes = [float(m.group(1)) for line in lines if (m := _COMPUTE_BUFFER.search(line))]
        if sizes:
            self.stats.compute_buffer_bytes = int(max(sizes) * (1 << 20))

    def _release(self, ctx: int) -> None:
        mtmd_cpp.mtmd_free(ctx)
        self.stats.loaded = False

    def encode(self, image: RgbImage) -> EncodedImage:
        """Run the encoder over one image. Raises InvalidArgument for images libmtmd refuses."""
        original = (image.width, image.height)
        if self.settings.max_image_side:
            image = image.resized_to_fit(self.settings.max_image_side)
        image_id, sentinel = image_identity(image)
        ctx = self._ctx
        load_ms = 0.0
        if ctx is None:
            ctx = self._open()
            load_ms = self.stats.last_load_ms
        try:
            with capture_native_log() as lines:
                encoded = self._encode_with(ctx, image, image_id, sentinel, original, load_ms)
            self._note_buffers(lines)
        finally:
            if ctx is not self._ctx:
                self._release(ctx)  # VLMOpt: the encoder's memory goes before decoding resumes
        self.stats.images_encoded += 1
        self.stats.last_encode_ms = encoded.encode_ms
        return encoded

    def _encode_with(
        self, ctx: int, image: RgbImage, image_id: str, sentinel: int, original: tuple[int, int], load_ms: float
    ) -> EncodedImage:
        pixels = (ctypes.c_ubyte * len(image.pixels)).from_buffer_copy(image.pixels)
        bitmap = mtmd_cpp.mtmd_bitmap_init(image.width, image.height, pixels)
        if not bitmap:
            raise InvalidArgument(f"libmtmd refused a {image.width}x{image.height} image")
        chunks = mtmd_cpp.mtmd_input_chunks_init()
        try:
            mtmd_cpp.mtmd_bitmap_set_id(bitmap, image_id.encode())
            marker = mtmd_cpp.mtmd_get_marker(ctx) or mtmd_cpp.mtmd_default_marker()
            text = mtmd_cpp.mtmd_input_text()
            text.text, text.text_len = marker, len(marker)
            text.add_special, text.parse_special = False, True
            bitmaps = (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = mtmd_cpp.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise InvalidArgument(f"the vision model cannot take this {image.width}x{image.height} image (mtmd_tokenize: {rc})")
            prefix: list[int] = []
            suffix: list[int] = []
            embeddings = None
            non_causal = False
            grid = (0, 0)
            t0 = time.perf_counter()
            for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
                chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, i)
                if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == _CHUNK_TEXT:
                    count = ctypes.c_size_t()
                    ids = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    (prefix if embeddings is None else suffix).extend(ids[j] for j in range(count.value))
                    continue
                if embeddings is not None:
                    raise EngineFailure("libmtmd split one image into several chunks; this projector is not supported")
                n_tokens = mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk)
                if mtmd_cpp.mtmd_input_chunk_get_n_pos(chunk) != n_tokens:
                    raise EngineFailure("M-RoPE projectors (Qwen-VL) need 2-D positions, which this engine does not feed yet")
                tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_image(chunk)
                grid = (mtmd_cpp.mtmd_image_tokens_get_nx(tokens), mtmd_cpp.mtmd_image_tokens_get_ny(tokens))
                non_causal = bool(mtmd_cpp.mtmd_decode_use_non_causal(ctx, chunk))
                if mtmd_cpp.mtmd_encode_chunk(ctx, chunk) != 0:
                    raise EngineFailure("the vision encoder failed on this image")
                n_embd = self._text_n_embd
                out = mtmd_cpp.mtmd_get_output_embd(ctx)
                flat = np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_float)), shape=(n_tokens * n_embd,))
                embeddings = flat.reshape(n_tokens, n_embd).copy()  # libmtmd reuses its buffer
            encode_ms = (time.perf_counter() - t0) * 1000.0
        finally:
            mtmd_cpp.mtmd_input_chunks_free(chunks)
            mtmd_cpp.mtmd_bitmap_free(bitmap)
        if embeddings is None:
            raise EngineFailure("libmtmd produced no image chunk")
        if self._image_size:
            # Fixed-grid projectors resize every image by design; only a budget's cap "downscales".
            encoded_size, downscaled = (self._image_size, self._image_size), False
        else:
            encoded_size = (grid[0] * self._patch_px, grid[1] * self._patch_px)
            capped = bool(self.settings.image_max_tokens) and encoded_size[0] < image.width * 0.95
            downscaled = (image.width, image.height) != original or capped
        return EncodedImage(
            image_id=image_id,
            sentinel=sentinel,
            prefix_tokens=tuple(prefix),
            suffix_tokens=tuple(suffix),
            embeddings=embeddings,
            non_causal=non_causal,
            original_size=original,
            encoded_size=encoded_size,
            downscaled=downscaled,
            encode_ms=encode_ms,
            load_ms=load_ms,
        )

    def close(self) -> None:
        if self._ctx is not None:
            self._release(self._ctx)
            self._ctx = None
