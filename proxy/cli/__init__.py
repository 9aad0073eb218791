"""The command line: ``pcp-proxy serve`` and ``pcp-proxy sessions``."""

from .main import main

__all__ = ["main"]
