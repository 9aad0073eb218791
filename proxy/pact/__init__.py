"""PACT components on sessions: their store and where a request meets them (``components``), and their API (``api``)."""

from .components import Components, ComponentStore

__all__ = ["ComponentStore", "Components"]
