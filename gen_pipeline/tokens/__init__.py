"""Token counting: the counter and its loaders, the chat renderer, and all token arithmetic (budget).

May import: the base modules.
"""

from .counter import (
    TINY_TOKENIZER,
    FastTokenCounter,
    FolderTemplate,
    HFTokenCounter,
    TemplateIdentity,
    TokenCounter,
    encoded_lengths,
    light_parts,
    load_counter,
    load_tokenizer,
    template_identity,
)
from .render import ChatTemplate

__all__ = [
    "TINY_TOKENIZER",
    "ChatTemplate",
    "FastTokenCounter",
    "FolderTemplate",
    "HFTokenCounter",
    "TemplateIdentity",
    "TokenCounter",
    "encoded_lengths",
    "light_parts",
    "load_counter",
    "load_tokenizer",
    "template_identity",
]
