"""What the worker model reads: the ``<PagedContext>`` markup and document, the frame, and the synthesis under a budget."""
