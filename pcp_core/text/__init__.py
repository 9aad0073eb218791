"""What a text holds, read without a model: its tokens, its content words, the times it states."""
