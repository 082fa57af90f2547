"""Render a model's Jinja chat template, the way Hugging Face transformers does, in a sandbox.

Templates come from model files, so they are untrusted: they run in Jinja's
ImmutableSandboxedEnvironment (no access to dunder attributes, no mutation of our data).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

# Used when a model ships no template: plain ChatML.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template failed to compile or render, or the messages are malformed."""


class ChatTemplateSecurityError(ChatTemplateError):
    """The template tried something the sandbox forbids (its __cause__ is jinja2's SecurityError)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc.message} (line {exc.lineno})") from exc


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(
            f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string, got {role!r}")
        content = m.get("content")
        if content is None and m.get("tool_calls"):
            continue  # an assistant turn that only calls tools
        if not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string, got {type(content).__name__}")


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **extra: Any,
) -> str:
    """Render `messages` with the model's chat template (ChatML when `template` is None).

    `extra` is passed to the template as variables (e.g. tools=..., date_string=...).
    Raises ChatTemplateError (a ValueError) for bad messages or a failing template.
    """
    _check_messages(messages)
    compiled = _compile(template if template is not None else CHATML_TEMPLATE)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **extra,
        )
    except SecurityError as exc:
        raise ChatTemplateSecurityError(f"chat template blocked by the sandbox: {exc}") from exc
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
    except Exception as exc:  # a template can raise anything (TypeError on bad ops, ...)
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
