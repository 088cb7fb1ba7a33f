"""Screenshots are checked in Python before native code sees a byte of them."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from sidecar.errors import InvalidArgument
from sidecar.vision.image_input import MAX_SIDE, decode_encoded, decode_raw

LIMIT = 32 << 20


def encoded(array: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, fmt)
    return out.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb's honest header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


@pytest.fixture
def picture() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)


def test_png_decodes_to_packed_rgb(picture) -> None:
    image = decode_encoded(encoded(picture, "PNG"), LIMIT)
    assert (image.width, image.height, image.source) == (64, 48, "png")
    assert image.pixels == picture.tobytes()


def test_jpeg_decodes_close_to_the_original(picture) -> None:
    smooth = np.full((48, 64, 3), 120, dtype=np.uint8)
    image = decode_encoded(encoded(smooth, "JPEG"), LIMIT)
    assert image.source == "jpeg" and (image.width, image.height) == (64, 48)
    assert np.abs(np.frombuffer(image.pixels, np.uint8).astype(int) - 120).max() <= 3


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty"),
        (b"definitely not an image", "not a PNG or JPEG"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "PNG or JPEG"),  # a PNG signature, then garbage
        (png_header_only(16384, 16384), "largest accepted"),
        (png_header_only(0, 10), "PNG or JPEG"),  # Pillow refuses a zero-sized header itself
    ],
)
def test_broken_files_are_refused_with_a_reason(data, reason) -> None:
    with pytest.raises(InvalidArgument) as e:
        decode_encoded(data, LIMIT)
    assert reason in str(e.value)


def test_truncated_png_is_refused(picture) -> None:
    data = encoded(picture, "PNG")
    with pytest.raises(InvalidArgument, match="corrupt or truncated"):
        decode_encoded(data[: len(data) // 2], LIMIT)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_unsupported(picture, fmt) -> None:
    with pytest.raises(InvalidArgument, match=f"PNG or JPEG; this one is {fmt}"):
        decode_encoded(encoded(picture, fmt), LIMIT)


def test_files_above_the_byte_limit_are_refused(picture) -> None:
    with pytest.raises(InvalidArgument, match="--max-image-bytes"):
        decode_encoded(encoded(picture, "PNG"), 1024)


def test_raw_rgba_bottom_up_with_padded_rows(picture) -> None:
    h, w, _ = picture.shape
    rgba = np.concatenate([picture, np.full((h, w, 1), 255, np.uint8)], axis=2)
    stride = w * 4 + 16  # engines pad rows to an alignment
    rows = np.zeros((h, stride), np.uint8)
    rows[:, : w * 4] = rgba[::-1].reshape(h, w * 4)  # bottom row first, as ReadPixels gives it
    image = decode_raw(rows.tobytes(), w, h, stride, "rgba8", True, LIMIT)
    assert image.pixels == picture.tobytes()
    # The last row's padding may be left off.
    trimmed = rows.tobytes()[: stride * (h - 1) + w * 4]
    assert decode_raw(trimmed, w, h, stride, "rgba8", True, LIMIT).pixels == picture.tobytes()


def test_raw_bgra_swaps_channels(picture) -> None:
    h, w, _ = picture.shape
    bgra = np.concatenate([picture[:, :, ::-1], np.zeros((h, w, 1), np.uint8)], axis=2)
    assert decode_raw(bgra.tobytes(), w, h, 0, "bgra8", False, LIMIT).pixels == picture.tobytes()


@pytest.mark.parametrize(
    "size, width, height, stride, match",
    [
        (100, 10, 10, 0, "do not match"),  # RGBA 10x10 is 400 bytes
        (400, 0, 10, 0, "at least 1 pixel"),
        (400, 10, 10, 20, "smaller than a row"),
        (16, MAX_SIDE + 1, 1, 0, "largest accepted"),
    ],
)
def test_raw_pixels_that_do_not_add_up_are_refused(size, width, height, stride, match) -> None:
    with pytest.raises(InvalidArgument, match=match):
        decode_raw(bytes(size), width, height, stride, "rgba8", False, LIMIT)


def test_resizing_keeps_the_aspect_ratio(picture) -> None:
    image = decode_encoded(encoded(picture, "PNG"), LIMIT).resized_to_fit(32)
    assert (image.width, image.height) == (32, 24)
    assert len(image.pixels) == 32 * 24 * 3
