"""Responses and Messages calls sent as chat completions where the upstream lacks them: an httpx transport (``transport``)
in front of the one that reaches the upstream, and chat's answers read back as the API's (``answers``)."""

from .transport import Translation, Translator

__all__ = ["Translation", "Translator"]
