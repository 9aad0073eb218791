"""all-MiniLM-L6-v2 on torch alone: a BERT encoder, mean-pooled and scaled to length 1, as sentence-transformers runs it.

Why not sentence-transformers itself: importing it brings transformers,
scikit-learn and scipy (for similarity functions the proxy never calls),
which stay resident beside torch and slow the start. This needs torch, ``tokenizers`` and ``safetensors`` only (all three
come with sentence-transformers). It reads the model's own files (its
``config.json``, ``tokenizer.json``, ``model.safetensors``), and its vectors
are the library's (``tests/proxy/test_bert.py`` compares them on the float
model, within 1e-5, and the int8 one).

As before, the linear layers run in int8 (torch's dynamic quantization), each
on its own scale as the library's are: the vectors are the ones the library's
int8 model gives (most within 1e-6, the rest within a cosine of 0.99, as a
batch's neighbours move them), so those stored before are still good.
(The word-piece table stays in float32: in float16, a little smaller, the
int8 model's vectors moved too far from the library's.) A query (one text, no padding) runs through a TorchScript
trace, which computes without the interpreter while a request pages its
history; a batch runs the module, its texts sorted by length and cut into
batches of at most ``BATCH_TOKENS`` word pieces, so that no batch's attention
holds much memory whatever the texts.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer

__all__ = ["BATCH_TOKENS", "BertEncoder"]

# Word pieces in one batch (padding included): 16 texts of 64. What a batch holds while it runs (its attention,
# the layers' outputs) is freed after it: smaller batches, and what each freed given back before the next
# (``between``), keep the peak low in no more time (``bench/resident.py``).
BATCH_TOKENS = 1024
MAX_TEXTS = 64  # texts in one batch at most
_QUIET = threading.Lock()  # around quantizing or tracing, whose warnings are silenced (the filters are global)


class _Layer(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int, eps: float):
        """One BERT layer: self-attention, then the feed-forward, each with its residual and norm."""
        super().__init__()
        self.heads = heads
        # Three layers, not one of three times the width: each is quantized on its own scale, as the library's are.
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.out = torch.nn.Linear(hidden, hidden)
        self.norm1 = torch.nn.LayerNorm(hidden, eps=eps)
        self.up = torch.nn.Linear(hidden, intermediate)
        self.down = torch.nn.Linear(intermediate, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """The layer over ``x``, attending where ``attend`` allows."""
        b, t, h = x.shape
        q, k, v = (part(x).view(b, t, self.heads, h // self.heads).transpose(1, 2) for part in (self.q, self.k, self.v))
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=attend).transpose(1, 2).reshape(b, t, h)
        x = self.norm1(self.out(mixed) + x)
        return self.norm2(self.down(F.gelu(self.up(x))) + x)


class _Bert(torch.nn.Module):
    """BERT's encoder and sentence-transformers' mean pooling and normalisation, for ``(ids, mask)`` of a batch."""

    def __init__(self, config: dict[str, Any]):
        """The encoder as ``config`` describes it, its weights empty until loaded."""
        super().__init__()
        hidden, eps = config["hidden_size"], config.get("layer_norm_eps", 1e-12)
        self.words = torch.nn.Parameter(torch.empty(config["vocab_size"], hidden), requires_grad=False)
        self.positions = torch.nn.Parameter(torch.empty(config["max_position_embeddings"], hidden), requires_grad=False)
        self.segment = torch.nn.Parameter(torch.empty(hidden), requires_grad=False)  # token type 0: a text is one segment
        self.norm = torch.nn.LayerNorm(hidden, eps=eps)
        self.layers = torch.nn.ModuleList(
            _Layer(hidden, config["intermediate_size"], config["num_attention_heads"], eps) for _ in range(config["num_hidden_layers"])
        )

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean-pooled, length-1 vectors of the texts ``ids`` holds (``mask``: their real word pieces)."""
        x = self.norm(self.words[ids] + self.positions[: ids.shape[1]] + self.segment)
        attend = mask[:, None, None, :].bool()
        for layer in self.layers:
            x = layer(x, attend)
        weights = mask.unsqueeze(-1).float()
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """The published weights (``model.safetensors``, names as transformers' BertModel has them), taken in place."""
        pick = weights.pop  # each tensor is dropped once copied: the float weights do not outlive the load
        with torch.no_grad():
            self.words.copy_(pick("embeddings.word_embeddings.weight"))
            self.positions.copy_(pick("embeddings.position_embeddings.weight"))
            self.segment.copy_(pick("embeddings.token_type_embeddings.weight")[0])
            self.norm.weight.copy_(pick("embeddings.LayerNorm.weight"))
            self.norm.bias.copy_(pick("embeddings.LayerNorm.bias"))
            for i, layer in enumerate(self.layers):
                at = f"encoder.layer.{i}."
                for part in ("weight", "bias"):
                    for mine, name in ((layer.q, "query"), (layer.k, "key"), (layer.v, "value")):
                        getattr(mine, part).copy_(pick(f"{at}attention.self.{name}.{part}"))
                    getattr(layer.out, part).copy_(pick(f"{at}attention.output.dense.{part}"))
                    getattr(layer.norm1, part).copy_(pick(f"{at}attention.output.LayerNorm.{part}"))
                    getattr(layer.up, part).copy_(pick(f"{at}intermediate.dense.{part}"))
                    getattr(layer.down, part).copy_(pick(f"{at}output.dense.{part}"))
                    getattr(layer.norm2, part).copy_(pick(f"{at}output.LayerNorm.{part}"))


class BertEncoder:
    """Unit vectors of texts from a BERT sentence model's directory (all-MiniLM-L6-v2's layout)."""

    def __init__(self, directory: Path, int8: bool = True):
        """The model in ``directory``, its linear layers in int8 unless ``int8`` is False."""
        config = json.loads((directory / "config.json").read_text())
        sentence = directory / "sentence_bert_config.json"
        self.max_tokens = json.loads(sentence.read_text()).get("max_seq_length", 256) if sentence.is_file() else 256
        self._tokenizers = [self._tokenizer(directory) for _ in range(2)]  # the batch's and the query's: never shared by two threads
        model = _Bert(config).eval()
        model.load(load_file(str(directory / "model.safetensors")))
        if int8:
            with _QUIET, warnings.catch_warnings():
                # Deprecated in favour of the torchao package; torch is locked (requirements.lock).
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
                model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        self.model = model
        self.dimension = config["hidden_size"]
        ids, mask = self._features(self._tokenizers[1], ["What did we decide about the invoice?"])
        with torch.inference_mode(), _QUIET, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript is deprecated in favour of torch.export; torch is pinned
            self._traced = torch.jit.trace(model, (ids, mask), check_trace=False)

    def _tokenizer(self, directory: Path) -> Tokenizer:
        """The model's tokenizer, truncating at its length and padding nothing."""
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=self.max_tokens)
        tokenizer.no_padding()  # a batch is padded here, to its longest text
        return tokenizer

    def _features(self, tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The word pieces of ``texts``, padded to the longest, and their mask."""
        return _padded([e.ids for e in tokenizer.encode_batch([t.strip() for t in texts])])  # stripped, as sentence-transformers does

    def one(self, text: str) -> Any:
        """One text's vector, by the trace (a query: one text has no padding)."""
        ids, mask = self._features(self._tokenizers[1], [text])
        with torch.inference_mode():
            return self._traced(ids, mask)[0].numpy()

    def batch(self, texts: Sequence[str], between: Callable[[], None] | None = None) -> Any:
        """The vectors of ``texts`` (float32, one a row, in order); ``between``: called between two batches."""
        pieces = [e.ids for e in self._tokenizers[0].encode_batch([t.strip() for t in texts])]
        order = sorted(range(len(texts)), key=lambda i: -len(pieces[i]))
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        start = 0
        while start < len(order):
            size = max(1, min(MAX_TEXTS, BATCH_TOKENS // max(len(pieces[order[start]]), 1)))
            chosen = order[start : start + size]
            with torch.inference_mode():
                out[chosen] = self.model(*_padded([pieces[i] for i in chosen])).numpy()
            start += size
            if between is not None and start < len(order):
                between()
        return out


def _padded(pieces: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Word-piece ids padded with 0 to the longest, and the mask of those that are not padding."""
    longest = max(map(len, pieces), default=0)
    ids = torch.zeros((len(pieces), longest), dtype=torch.long)
    mask = torch.zeros((len(pieces), longest), dtype=torch.long)
    for row, text in enumerate(pieces):
        ids[row, : len(text)] = torch.tensor(text, dtype=torch.long)
        mask[row, : len(text)] = 1
    return ids, mask
