"""An encoder run by sentence-transformers (all-mpnet-base-v2), its linear layers in int8, a query by a trace.

MiniLM, the default, runs on torch alone (``proxy.recall.bert``), without
what this library's import keeps resident; mpnet's architecture is left to
the library.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TRACE_TEXTS", "OneText", "SentenceModel"]

log = logging.getLogger("pcp.embeddings")

_QUIET = threading.Lock()  # around quantizing or tracing a model, whose warnings are silenced
# Traced with this text; checked against the model on it and on a text of another length.
TRACE_TEXTS = ("What did we decide about the invoice?", "Melanie adopted a puppy in May 2023, after the support group meeting.")


class SentenceModel:
    """Unit vectors of texts by a sentence-transformers model (``one`` for a query, ``batch`` for many)."""

    def __init__(self, directory: Path, batch_size: int = 64):
        """The model in ``directory`` on CPU, its linear layers in int8, a query traced."""
        import torch
        from sentence_transformers import SentenceTransformer

        _no_progress_bars()
        model = SentenceTransformer(str(directory), device="cpu")
        with _QUIET, warnings.catch_warnings():  # the filters are global: one thread at a time
            # Deprecated in favour of the torchao package; torch is locked (requirements.lock).
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)  # see Encoder.variant
        self.model = model
        self.batch_size = batch_size
        self._one_text = OneText.of(model)

    def one(self, text: str) -> Any:
        """The vector of one text: by the trace where there is one."""
        return self._one_text(text) if self._one_text is not None else self.batch([text])[0]

    def batch(self, texts: Sequence[str], between: Callable[[], None] | None = None) -> Any:
        """``between`` is not called: the library cuts the batches."""
        return self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False).astype(
            np.float32
        )  # no progress bar: it wrote to the log at each batch


def _no_progress_bars() -> None:
    """Loading a model draws tqdm bars ("Loading weights"), and they went to the log: none."""
    try:
        import huggingface_hub.utils
        import transformers.utils.logging

        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
    except (ImportError, AttributeError):  # a version without them draws none
        pass


class OneText:
    """The model's vector for one text, from a TorchScript trace of its forward.

    A query is encoded while the request pages its history on the other
    thread. ``SentenceTransformer.encode`` runs module by module in Python and
    needs the interpreter between operations; the paging holds it in 5 ms
    slices, so the two took as long together as one after the other. The
    trace runs the same operations in C++, without the interpreter, and
    overlaps the paging. For one text the vector is the
    model's (within 1e-6); a batch is left to ``encode``, as its padding is
    what the trace does not follow. If the trace disagrees with the model on
    ``TRACE_TEXTS``, ``of`` gives None and queries are encoded as before.
    """

    def __init__(self, model: Any):
        """The trace of ``model``'s forward over one text."""
        import torch

        example = model.preprocess([TRACE_TEXTS[0]])
        names = [k for k, v in example.items() if isinstance(v, torch.Tensor)]
        extras = {k: v for k, v in example.items() if k not in names}  # e.g. the modality, a string

        class Positional(torch.nn.Module):  # a trace takes tensors by position, the model a dict of features
            def __init__(self) -> None:
                """The model, its features given by position (what a trace takes)."""
                super().__init__()
                self.model = model

            def forward(self, *tensors: Any) -> Any:
                """The sentence embedding of the features given."""
                return self.model({**extras, **dict(zip(names, tensors))})["sentence_embedding"]

        self._model = model
        self._names = names
        with torch.inference_mode(), _QUIET, warnings.catch_warnings():
            # The branches the tracer warns of (padding, causal masks) are fixed for one unpadded text.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # TorchScript is deprecated in favour of torch.export, whose programs run op by op
            # in Python, and torch.compile, which builds C++ at start; torch is locked (requirements.lock).
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)  # transformers, on an attribute the tracer reads
            self._traced = torch.jit.trace(Positional().eval(), tuple(example[k] for k in names), check_trace=False)

    @classmethod
    def of(cls, model: Any) -> OneText | None:
        """The trace, if it agrees with ``model`` on ``TRACE_TEXTS``; else None."""
        one = cls(model)
        expected = model.encode(list(TRACE_TEXTS), batch_size=1, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        if all(np.allclose(one(text), vector, atol=1e-5) for text, vector in zip(TRACE_TEXTS, expected)):
            return one
        log.warning("the traced embedding model disagrees with the model: queries are encoded without it")
        return None

    def __call__(self, text: str) -> Any:
        """The vector of ``text``, by the trace."""
        import torch

        features = self._model.preprocess([text])
        with torch.inference_mode():
            return self._traced(*(features[k] for k in self._names))[0].numpy()
