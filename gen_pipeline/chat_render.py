"""Moved to gen_pipeline.tokens.render; this name stays only for sim/fleet.py's import until it moves too."""

from .tokens.render import ChatTemplate

__all__ = ["ChatTemplate"]
