"""Chat templates: llama.cpp's own renderer (llama_chat_apply_template), never a Jinja copy.

A GGUF may carry its template (`tokenizer.chat_template`); llama.cpp recognises it by its
text and renders it with built-in code. A base model such as Gemma 3 270M carries none: the
caller names one of llama.cpp's built-in templates (`builtin_templates()`), or the model's
architecture picks one (`ARCH_TEMPLATES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._native import ffi, lib
from ..errors import ConfigError

if TYPE_CHECKING:
    from .model import Model

# The built-in template an architecture's instruction-tuned models use, for a GGUF without one.
ARCH_TEMPLATES = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "qwen2": "chatml",
    "qwen3": "chatml",
    "phi3": "phi3",
    "mistral": "mistral-v7",
}
ROLES = ("system", "user", "assistant", "tool", "developer")


def builtin_templates() -> list[str]:
    """The names of llama.cpp's built-in templates (llama_chat_builtin_templates)."""
    n = int(lib.llama_chat_builtin_templates(ffi.NULL, 0))
    out = ffi.new("const char *[]", n)
    lib.llama_chat_builtin_templates(out, n)
    return [ffi.string(out[i]).decode() for i in range(n)]


@dataclass(frozen=True)
class ChatTemplate:
    """A template to render with: `name` says where it came from (`gguf`, a built-in
    name, or `NAME (architecture ARCH)`); `source` is what llama.cpp is given."""

    name: str
    source: str

    @staticmethod
    def for_model(model: Model, name: str | None = None) -> ChatTemplate:
        """The template named (a built-in), else the GGUF's own, else the architecture's.

        ConfigError for an unknown name, or a model with neither template nor known
        architecture (naming `--chat-template`)."""
        if name is not None:
            known = builtin_templates()
            if name not in known:
                raise ConfigError(
                    f"unknown chat template {name!r}; llama.cpp's built-in templates are: "
                    + ", ".join(sorted(known))
                )
            return ChatTemplate(name, name)
        own = lib.llama_model_chat_template(model.ptr, ffi.NULL)
        if own != ffi.NULL:
            return ChatTemplate("gguf", ffi.string(own).decode("utf-8", errors="replace"))
        arch = model.architecture
        if arch in ARCH_TEMPLATES:
            picked = ARCH_TEMPLATES[arch]
            return ChatTemplate(f"{picked} (architecture {arch})", picked)
        raise ConfigError(
            f"{model.path.name} carries no chat template and its architecture {arch!r} has no "
            "default: name one of llama.cpp's built-in templates with --chat-template"
        )

    def render(self, messages: Sequence[Mapping[str, str]], *, add_assistant: bool = True) -> str:
        """The prompt text of messages (each {"role", "content"}), ending with the
        assistant's turn opened when add_assistant. ConfigError for a bad message or a
        template llama.cpp cannot render."""
        if not messages:
            raise ConfigError("messages must hold at least one message")
        keep = []  # the C strings must outlive the call
        chat = ffi.new("llama_chat_message[]", len(messages))
        size = 0
        for i, m in enumerate(messages):
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise ConfigError(f"messages[{i}] needs a string role and a string content")
            for text in (role, content):
                if "\x00" in text:
                    raise ConfigError(f"messages[{i}] holds a NUL character")
            keep += [ffi.new("char[]", role.encode()), ffi.new("char[]", content.encode())]
            chat[i].role, chat[i].content = keep[-2], keep[-1]
            size += len(keep[-1]) + len(keep[-2])
        tmpl = ffi.new("char[]", self.source.encode())
        cap = 2 * size + 512
        for _ in range(2):
            buf = ffi.new("char[]", cap)
            n = int(
                lib.llama_chat_apply_template(tmpl, chat, len(messages), add_assistant, buf, cap)
            )
            if n < 0:
                raise ConfigError(f"chat template {self.name!r} cannot render these messages")
            if n <= cap:
                return bytes(ffi.buffer(buf, n)).decode("utf-8", errors="replace")
            cap = n + 1
        raise ConfigError(f"chat template {self.name!r}: the rendered prompt kept growing")
