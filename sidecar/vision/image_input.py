"""Screenshots as the game sends them, checked and turned into packed RGB before native code sees them.

Images come from outside the process: corrupt files, lying headers and decompression bombs must be
refused here, in Python, with INVALID_ARGUMENT, never handed to the C decoder inside libmtmd.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from sidecar.errors import InvalidArgument

# The largest side and pixel count accepted. 8K screens are 7680x4320 (33 Mpx); anything larger is
# not a screenshot, and decoding it would cost the game hundreds of megabytes.
MAX_SIDE = 8192
MAX_PIXELS = 8192 * 8192
ACCEPTED_FORMATS = ("PNG", "JPEG")
RAW_LAYOUTS = {"rgba8": (4, (0, 1, 2)), "bgra8": (4, (2, 1, 0)), "rgb8": (3, (0, 1, 2))}


@dataclass(frozen=True)
class RgbImage:
    """Packed 8-bit RGB rows, top row first, as libmtmd's bitmaps take them."""

    width: int
    height: int
    pixels: bytes
    source: str  # "png", "jpeg", or the raw layout ("rgba8", ...)

    def resized_to_fit(self, max_side: int) -> RgbImage:
        """This image scaled down (aspect kept) so its longer side is at most `max_side`."""
        longest = max(self.width, self.height)
        if longest <= max_side:
            return self
        scale = max_side / longest
        size = (max(1, round(self.width * scale)), max(1, round(self.height * scale)))
        picture = Image.frombytes("RGB", (self.width, self.height), self.pixels)
        small = picture.resize(size, Image.Resampling.BICUBIC)
        return RgbImage(size[0], size[1], small.tobytes(), self.source)


def _check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0:
        raise InvalidArgument(f"the image is {width}x{height}; both sides must be at least 1 pixel")
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise InvalidArgument(
            f"the image is {width}x{height}; the largest accepted is {MAX_SIDE}x{MAX_SIDE} pixels"
        )


def decode_encoded(data: bytes, max_bytes: int) -> RgbImage:
    """A PNG or JPEG file's bytes as RGB. INVALID_ARGUMENT for anything else or anything broken."""
    if not data:
        raise InvalidArgument("the image is empty (0 bytes)")
    if len(data) > max_bytes:
        raise InvalidArgument(f"the image is {len(data)} bytes; the limit is {max_bytes} (--max-image-bytes)")
    try:
        picture = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:
        raise InvalidArgument(f"the image is far larger than the largest accepted, {MAX_SIDE}x{MAX_SIDE} pixels") from None
    except UnidentifiedImageError:
        raise InvalidArgument("the image is not a PNG or JPEG file (unrecognised or corrupt data)") from None
    except Exception as e:  # Pillow raises a zoo of types for damaged headers
        raise InvalidArgument(f"the image header is corrupt: {e}") from None
    if picture.format not in ACCEPTED_FORMATS:
        raise InvalidArgument(f"images must be PNG or JPEG; this one is {picture.format}")
    _check_size(*picture.size)  # before decoding: a bomb's header is honest about its size
    try:
        picture.load()
        rgb = picture.convert("RGB")
    except Exception as e:
        raise InvalidArgument(f"the {picture.format} data is corrupt or truncated: {e}") from None
    return RgbImage(rgb.width, rgb.height, rgb.tobytes(), picture.format.lower())


def decode_raw(
    pixels: bytes, width: int, height: int, stride: int, layout: str, bottom_up: bool, max_bytes: int
) -> RgbImage:
    """Raw pixels as an engine reads back a render texture, repacked as top-down RGB."""
    if layout not in RAW_LAYOUTS:
        raise InvalidArgument(f"unknown pixel format {layout!r}; use one of {', '.join(RAW_LAYOUTS)}")
    _check_size(width, height)
    bpp, channels = RAW_LAYOUTS[layout]
    row = width * bpp
    stride = stride or row
    if stride < row:
        raise InvalidArgument(f"stride {stride} is smaller than a row of {width} {layout} pixels ({row} bytes)")
    if len(pixels) > max_bytes:
        raise InvalidArgument(f"the image is {len(pixels)} bytes; the limit is {max_bytes} (--max-image-bytes)")
    # The last row needs no padding after it; engines send either form.
    if len(pixels) not in (stride * height, stride * (height - 1) + row):
        raise InvalidArgument(
            f"{len(pixels)} bytes of pixels do not match {width}x{height} {layout} with stride {stride} "
            f"(expected {stride * height} bytes)"
        )
    padded = np.frombuffer(pixels + bytes(stride * height - len(pixels)), dtype=np.uint8)
    grid = padded.reshape(height, stride)[:, :row].reshape(height, width, bpp)
    rgb = grid[:, :, list(channels)]
    if bottom_up:
        rgb = rgb[::-1]
    return RgbImage(width, height, np.ascontiguousarray(rgb).tobytes(), layout)
