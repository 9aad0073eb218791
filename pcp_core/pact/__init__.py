"""PACT (Positioned Adaptive Context Tree): components pinned to a place in a conversation, and where they render."""
