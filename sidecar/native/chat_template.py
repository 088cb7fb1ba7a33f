"""Render a model's Jinja chat template, in a sandbox (templates come from model files we did not write)."""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    """The template could not be rendered by Jinja (unsupported syntax, or it raised on purpose)."""


def _raise_exception(message: str) -> None:
    # Templates call raise_exception() to reject conversations they cannot format
    # (e.g. two user turns in a row); turn that into our error, not a crash.
    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def render_jinja_template(
    template: str,
    messages: list[tuple[str, str]],
    *,
    add_assistant_prompt: bool,
    bos_token: str,
    eos_token: str,
) -> str:
    """Render `messages` ((role, content) pairs) through `template`; raise TemplateError if it cannot."""
    try:
        return _compile(template).render(
            messages=[{"role": r, "content": c} for r, c in messages],
            add_generation_prompt=add_assistant_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateError:
        raise
    except jinja2.TemplateError as e:
        raise TemplateError(str(e)) from e
