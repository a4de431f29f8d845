"""Counting prompt tokens the way the server does.

SGLang and vLLM render `apply_chat_template(messages, tools=..., add_generation_prompt=True,
**chat_template_kwargs)` with the model's own Hugging Face template and encode the text without adding
special tokens again, so rendering the same request then batch-encoding it here gives exactly the
server's `usage.prompt_tokens`. `count` takes conversations as plain message lists or as
`Conversation`s carrying tools and template kwargs too (tokens/conversation.py), and returns an error
text instead of a count for a row the server would refuse or its template raises for.

`load_counter` reads a local tokenizer folder with the Rust `tokenizers` library and renders with
`render.ChatTemplate` (transformers' environment and inputs, with transformers itself as the fallback):
no transformers import unless a request needs it, ~100 MB less memory, 2.5 s less start-up. Folders it
cannot read exactly that way (no tokenizer.json, a legacy special_tokens_map.json, several named
templates, a template our environment cannot compile) and hub names go through transformers'
AutoTokenizer, as does everything with loader="transformers" (the CLI's GEN_PIPELINE_TOKENIZER_LOADER).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError, RequestShapeError
from .conversation import ChatInput, ServerView, flat_tools, server_view
from .pieces import PieceLengths
from .render import ChatTemplate, compile_template

log = logging.getLogger(__name__)

TINY_TOKENIZER = Path(__file__).parents[1] / "data" / "tiny-tokenizer"
ENCODE_CHARS = 200_000  # characters per encode call (~1 ms of GIL at a time)


class TokenCounter(Protocol):
    """Counts the chat prompt tokens of each conversation; an entry is an error text when it cannot."""

    name: str
    chat_template: Any  # the template source (transformers may hold several, by name)

    def count(self, conversations: Sequence[ChatInput]) -> list[int | str]: ...


def failure_text(exc: Exception) -> str:
    """What a row that cannot be counted is ledgered with."""
    if isinstance(exc, RequestShapeError):
        return str(exc)
    if isinstance(exc, KeyError):  # str() of a KeyError is the bare key: "chat template failed: 'messages'"
        key = exc.args[0] if exc.args else None
        return f"chat template failed: the template needs the key {key!r}, which its input does not have (KeyError)"
    return f"chat template failed: {exc}"  # jinja raise_exception(), type errors in the template


def count_rendered(
    conversations: Sequence[ChatInput], render: Callable[[ChatInput], str], lengths: Callable[[list[str]], list[int]]
) -> list[int | str]:
    """Each conversation's token count, or why it could not be rendered: render all, then encode the rendered
    ones in one `lengths` call (both counters share this)."""
    texts: list[str] = []
    where: list[int] = []
    out: list[int | str] = []
    for i, chat in enumerate(conversations):
        try:
            texts.append(render(chat))
        except Exception as exc:
            out.append(failure_text(exc))
            continue
        where.append(i)
        out.append(0)
    for i, n in zip(where, lengths(texts), strict=True):
        out[i] = n
    return out


def hf_render(tokenizer: Any, view: ServerView, add_generation_prompt: bool = True) -> str:
    """transformers' own render of a request the server has shaped."""
    out: str = tokenizer.apply_chat_template(
        view.messages,
        tools=view.tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **view.template_kwargs,
    )
    return out


def content_format_of(source: Any) -> str:
    """The content format the server detects for a template ("string" when ours cannot parse it)."""
    from .conversation import content_format

    if not isinstance(source, str):
        return "string"
    try:
        return content_format(compile_template(source).environment, source)
    except Exception:
        return "string"


class HFTokenCounter:
    """A Hugging Face tokenizer with its chat template, rendering with apply_chat_template."""

    def __init__(self, tokenizer: Any, name: str, server: str = "sglang") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"tokenizer {name!r} has no chat template; the server would need one too")
        self.tokenizer = tokenizer
        self.name = name
        self.chat_template: Any = tokenizer.chat_template
        self.server = server
        self.content_format = content_format_of(self.chat_template)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.pieces = PieceLengths(backend, encoded_lengths) if backend is not None else None

    def count(self, conversations: Sequence[ChatInput]) -> list[int | str]:
        """Render every conversation, then encode all of them in one call."""
        return count_rendered(conversations, self.render, self._lengths)

    def render(self, chat: ChatInput) -> str:
        """The prompt text of one conversation (again with flat tools where SGLang would retry so)."""
        view = server_view(chat, content_format=self.content_format, server=self.server)
        try:
            return hf_render(self.tokenizer, view)
        except Exception:
            if (flat := flat_tools(view, self.server)) is None:
                raise
            return hf_render(self.tokenizer, flat)

    def _lengths(self, texts: list[str]) -> list[int]:
        """Token counts of rendered prompts, without adding special tokens again."""
        if not texts:
            return []
        if self.pieces is not None:  # the Rust tokenizer directly: half the cost of the Python wrapper
            return self.pieces(texts)
        ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
        return [len(x) for x in ids["input_ids"]]


class FastTokenCounter:
    """A `tokenizers.Tokenizer` from tokenizer.json plus the folder's chat template, no transformers."""

    def __init__(self, tokenizer: Any, template: ChatTemplate, name: str, whole: bool = False) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.chat_template: Any = template.source
        self.name = name
        # `whole`: encode every text whole (the simulator, which must count as a server does, not as we do)
        self.pieces: Callable[[list[str]], list[int]] = (
            partial(encoded_lengths, tokenizer) if whole else PieceLengths(tokenizer, encoded_lengths)
        )

    def count(self, conversations: Sequence[ChatInput]) -> list[int | str]:
        """Render every conversation, then encode the rendered ones (a long one by its pieces: pieces.py)."""
        return count_rendered(conversations, self.template.render, self.pieces)


class TransformersFallback:
    """transformers' apply_chat_template for the requests ChatTemplate leaves to it; loaded on first use."""

    def __init__(self, name_or_path: str) -> None:
        self.name_or_path = name_or_path
        self.tokenizer: Any = None

    def __call__(self, view: ServerView, add_generation_prompt: bool = True) -> str:
        if self.tokenizer is None:
            log.info("rendering with transformers for a request our renderer leaves to it")
            self.tokenizer = load_tokenizer(self.name_or_path).tokenizer
        return hf_render(self.tokenizer, view, add_generation_prompt)


def encoded_lengths(tokenizer: Any, texts: list[str], chunk_chars: int = ENCODE_CHARS) -> list[int]:
    """Token counts, encoding at most ENCODE_CHARS characters a call.

    encode_batch holds the GIL while it takes its inputs in and hands the results back (~25 ms for 256
    prompts of 8k tokens); smaller calls keep the event loop's dispatch gaps short at the same speed.
    len(encoding) is the id count without building the ids list.
    """
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch  # _fast: no offsets
    out: list[int] = []
    start, chars = 0, 0
    for end, text in enumerate(texts, start=1):
        chars += len(text)
        if chars >= chunk_chars or end == len(texts):
            out += [len(e) for e in encode(texts[start:end], add_special_tokens=False)]
            start, chars = end, 0
    return out


SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def light_parts(folder: Path) -> tuple[str, dict[str, str]] | None:
    """The chat template and named special tokens transformers would use, when a folder is that simple."""
    config_file, template_file = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    if not (folder / "tokenizer.json").is_file() or not config_file.is_file():
        return None
    if (folder / "special_tokens_map.json").exists() or (folder / "additional_chat_templates").exists():
        return None
    if any(folder.glob("chat_template_*.jinja")):
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    source = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
    if not isinstance(source, str):
        return None
    special: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
        elif value is not None:
            return None
    return source, special


class TemplateIdentity(Protocol):
    """What a run's manifest records of its tokenizer: the name it was loaded by and its chat template."""

    @property
    def name(self) -> str: ...

    @property
    def chat_template(self) -> Any: ...


@dataclass(frozen=True)
class FolderTemplate:
    """A light folder's name and chat template, read without loading its tokenizer.json."""

    name: str
    chat_template: str


LOADERS = ("auto", "transformers")


def _light_folder(name_or_path: str, loader: str) -> tuple[str, dict[str, str]] | None:
    """light_parts of the folder when load_counter takes the light path there, else None."""
    folder = Path(name_or_path)
    if not folder.is_dir() or loader == "transformers":
        return None
    try:
        return light_parts(folder)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read tokenizer folder {name_or_path!r}: {exc}") from exc


def _template(name_or_path: str, parts: tuple[str, dict[str, str]], server: str = "sglang") -> ChatTemplate | None:
    """The folder's template compiled by us, or None when only transformers compiles it."""
    try:
        return ChatTemplate(*parts, server=server, fallback=TransformersFallback(name_or_path))
    except Exception as exc:
        if transformers_compiles(parts[0]):
            log.info("chat template of %s: rendered by transformers (%s)", name_or_path, exc)
            return None
        raise ConfigError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc


def quiet_transformers() -> None:
    """transformers logs errors only (not its notes at import, such as PyTorch not being installed), unless the
    user set its verbosity. Called before each import of it: this module is the only one that imports it."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def transformers_compiles(source: str) -> bool:
    """Whether transformers' own environment compiles this template."""
    quiet_transformers()
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(source)
    except Exception:
        return False
    return True


def load_counter(name_or_path: str, loader: str = "auto", server: str = "sglang") -> TokenCounter:
    """The client's token counter: the light loader when the folder allows it, else transformers.
    `server` is the kind of server whose normalisation of messages it counts (SERVER_KINDS)."""
    parts = _light_folder(name_or_path, loader)
    template = _template(name_or_path, parts, server) if parts is not None else None
    if template is None:
        return load_tokenizer(name_or_path, server)
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(Path(name_or_path) / "tokenizer.json"))
    except Exception as exc:
        raise ConfigError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc
    return FastTokenCounter(tok, template, name_or_path)


def template_identity(name_or_path: str, loader: str = "auto") -> TemplateIdentity:
    """The name and chat template load_counter's counter would have, without the vocabulary when possible.

    For the parent of `--workers K`, which records the manifest but counts nothing: the workers load the
    tokenizer themselves. Other folders and hub names are loaded in full.
    """
    parts = _light_folder(name_or_path, loader)
    template = _template(name_or_path, parts) if parts is not None else None
    if template is None:  # what load_counter does then
        return load_tokenizer(name_or_path)
    return FolderTemplate(name_or_path, template.source)


def load_tokenizer(name_or_path: str, server: str = "sglang") -> HFTokenCounter:
    """Load a tokenizer from a local folder or a hub name (the hub is tried only for non-paths)."""
    check_tokenizer_source(name_or_path)
    quiet_transformers()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:
        raise ConfigError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc
    return HFTokenCounter(tok, name_or_path, server)


# A folder holding one of these can hold a tokenizer; transformers' error for one holding none asks for
# sentencepiece ("Couldn't instantiate the backend tokenizer ...").
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
# What the hub takes as a model name: "name" or "namespace/name" (huggingface_hub's validate_repo_id)
HUB_NAME = re.compile(r"^(?!.*(--|\.\.))[\w][\w.-]{0,95}(/[\w][\w.-]{0,95})?$")


def check_tokenizer_source(name_or_path: str) -> None:
    """A tokenizer that is no folder here and cannot be a hub name (a mistyped path), or a folder with no
    tokenizer in it, is refused in one line saying what to give instead of the hub's or transformers' error."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ConfigError(
                f"tokenizer folder {name_or_path!r} holds no tokenizer (no tokenizer.json or tokenizer_config.json): "
                "copy the model's tokenizer files into it, or give --tokenizer the model's folder"
            )
    elif path.exists():
        raise ConfigError(f"tokenizer {name_or_path!r} is a file: give --tokenizer the folder that holds it")
    elif not HUB_NAME.match(name_or_path):
        raise ConfigError(
            f"tokenizer {name_or_path!r} is no folder here (nor a hub name): give --tokenizer a folder holding "
            "the model's tokenizer.json, or its hub name such as Qwen/Qwen3-8B"
        )
