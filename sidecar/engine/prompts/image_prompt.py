"""Images inside a prompt's token list: where each one's embeddings go, and what a request reports.

An image stands in the token list as its EncodedImage.span (projector text tokens around a run of
one sentinel id), so the ordinary prefix matching against a sequence's cache also tells whether
an image is already there. Prompts are tokenized, images in place, by chat_segments.
"""

from __future__ import annotations

from sidecar.backend.requests import ImageReport
from sidecar.vision.encoder import EncodedImage


def whole_images_prefix(common: int, spans: dict[int, EncodedImage]) -> int:
    """`common` cached tokens cut back to the start of any image it ends inside: half an image's
    embeddings cannot be completed from token ids."""
    for start, image in spans.items():
        if start < common < start + image.n_tokens:
            return start
    return common


def image_report(image: EncodedImage, encoded_now: bool) -> ImageReport:
    return ImageReport(
        original_size=image.original_size,
        encoded_size=image.encoded_size,
        downscaled=image.downscaled,
        image_tokens=image.n_tokens,
        encode_ms=image.encode_ms if encoded_now else 0.0,
        reused=not encoded_now,
    )
