"""The embedded default upstream: llama.cpp's llama-server running a small bundled model.

``files`` finds the server and the model, ``server`` starts, watches and stops
the process, ``slots`` is the way to it: a bounded queue in front of its slots,
and its errors in the proxy's envelope.
"""

from .files import INSTALL_HINT, local_missing
from .server import LocalModel, LocalModelError

__all__ = ["INSTALL_HINT", "LocalModel", "LocalModelError", "local_missing"]
