"""Encryption at rest of the text the proxy stores (sessions, model summaries), with ``PCP_DATA_KEY``.

AES-256-GCM (the ``cryptography`` package, the ``encryption`` extra), a
random 96-bit nonce per value, and the value's key in the store as
associated data: a value moved under another key (another caller's
session) does not open. A sealed value starts with ``MAGIC``; one that
does not was stored before encryption was turned on and is read as it is.
A value that does not open (another key, or none) reads as missing: its
session is paged again, its summary asked for again.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os

__all__ = ["MAGIC", "Sealer", "data_key"]

log = logging.getLogger("pcp.sealing")

MAGIC = b"pcpE1"  # format 1: MAGIC, 12-byte nonce, ciphertext and 16-byte tag
NONCE = 12
KEY_BYTES = 32


def data_key(text: str) -> bytes:
    """The 32-byte key that ``PCP_DATA_KEY`` spells in base64 (standard or URL-safe) or hex; ValueError if it spells none."""
    text = text.strip()
    candidates = []
    if len(text) == 2 * KEY_BYTES:
        candidates.append(lambda: bytes.fromhex(text))
    candidates += [lambda: base64.b64decode(text, validate=True), lambda: base64.urlsafe_b64decode(text)]
    for decode in candidates:
        try:
            key = decode()
        except (ValueError, binascii.Error):
            continue
        if len(key) == KEY_BYTES:
            return key
    raise ValueError('must be 32 bytes in base64 or hex; make one with: python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())"')


class Sealer:
    """Seals values before they are stored and opens them when read; without a key it passes them as they are."""

    def __init__(self, key: bytes | None = None):
        self.aead = None
        if key is not None:
            try:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            except ImportError:
                raise RuntimeError("data_key is set but the cryptography package is not installed: pip install 'pcp-proxy[encryption]'") from None
            self.aead = AESGCM(key)
        self.warned = False

    @property
    def sealing(self) -> bool:
        """Whether a data key seals what is stored."""
        return self.aead is not None

    def seal(self, data: bytes, context: str) -> bytes:
        """``data`` sealed for ``context`` (as it is, without a data key)."""
        if self.aead is None:
            return data
        nonce = os.urandom(NONCE)
        return MAGIC + nonce + self.aead.encrypt(nonce, data, context.encode())

    def open(self, data: bytes, context: str) -> bytes | None:
        """``data`` as it was before ``seal``; None if it is sealed and this key does not open it."""
        if not data.startswith(MAGIC):
            return data
        if self.aead is not None:
            from cryptography.exceptions import InvalidTag

            try:
                return self.aead.decrypt(data[len(MAGIC) : len(MAGIC) + NONCE], data[len(MAGIC) + NONCE :], context.encode())
            except InvalidTag:
                pass
        if not self.warned:
            self.warned = True
            log.warning("stored values sealed under another data_key (or none set) are read as missing: their sessions are paged again")
        return None
