"""Images inside a prompt's token list: where each one's embeddings go, and what a request reports.

An image stands in the token list as its EncodedImage.span (projector text tokens around a run of
one sentinel id), so the ordinary prefix matching against a sequence's cache also tells whether
an image is already there. Pure: the tokenizer comes in as a function.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.engine.requests import IMAGE_MARKER, ImageReport
from sidecar.errors import InvalidArgument
from sidecar.vision.encoder import EncodedImage

Tokenize = Callable[..., list[int]]  # (text, *, add_bos, parse_special) -> token ids


def tokenize_with_images(
    tokenize: Tokenize, prompt_text: str, images: list[EncodedImage]
) -> tuple[list[int], dict[int, EncodedImage]]:
    """The prompt's tokens with each image marker replaced by its image's span, and the index of
    each image's first embedding."""
    pieces = prompt_text.split(IMAGE_MARKER)
    if len(pieces) - 1 != len(images):
        raise InvalidArgument(f"message text may not contain {IMAGE_MARKER!r}; it stands for images")
    tokens = tokenize(pieces[0], add_bos=True, parse_special=True)
    spans: dict[int, EncodedImage] = {}
    for image, piece in zip(images, pieces[1:]):
        spans[len(tokens) + len(image.prefix_tokens)] = image
        tokens.extend(image.span)
        tokens.extend(tokenize(piece, add_bos=False, parse_special=True))
    return tokens, spans


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
