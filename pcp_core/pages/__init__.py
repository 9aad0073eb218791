"""Pages (§5): what a page is, how pages hang in a tree and an index, and how each is summarised and shown."""
