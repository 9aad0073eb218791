"""``tune_process``: what a process serving the proxy does differently from a plain Python process."""

from __future__ import annotations

import os

from ..settings import Settings

__all__ = ["YOUNG_GENERATION", "one_blas_thread", "tune_process"]

YOUNG_GENERATION = 20_000  # see tune_process


def tune_process(settings: Settings) -> None:
    """What this process does differently for serving the proxy.

    Files it makes are private to its user (umask 077). The young generation is collected once 20,000 more objects live than at
    the last collection, not 700: a follow-up on a long history makes and
    drops tens of thousands of objects, which reference counting frees; at
    700 the collector ran several times a request and found nothing to
    collect. The encoder of dense recall and torch are not
    imported here: they load when a request first wants them
    (``embeddings.prepare_process``), so a proxy that forwards stays small.
    """
    import gc

    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])
    one_blas_thread()
    # Whatever the proxy writes (sessions, caches, the local model's log) is its user's alone.
    os.umask(0o077)


def one_blas_thread() -> None:
    """numpy's products (dense recall's cosines) on one thread, as torch's are (``embeddings.TORCH_THREADS``).

    OpenBLAS splits a history's matrix-vector product over every core and its
    threads spin while they wait for each other: on two cores shared with the
    requests, a million-token history's cosines took many times longer with its
    threads than on one (``bench/lean.py``; the results are the same to the bit:
    each row's sum is one thread's either way). Without threadpoolctl installed,
    numpy keeps its default.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1, user_api="blas")
