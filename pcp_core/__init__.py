"""The Paged-Context-Protocol engine: pure data and rules, no I/O."""
