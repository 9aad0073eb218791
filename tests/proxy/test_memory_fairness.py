"""Memory writes are fair between tenants: one caller's queue of writes never holds another's behind it.

Timings (another tenant's forget during a 4,000-page import) are in
bench/own_api_limits.py; here the order the writer serves is checked, with the
first job held until every other is queued.
"""

from __future__ import annotations

import json
import threading

from proxy.memory.store import scope_key
from proxy.metrics import Metrics
from proxy.testing.upstream import metric_value

AUTH = {"authorization": "Bearer sk-a"}


def test_another_tenants_write_goes_before_the_rest_of_a_long_queue(start_proxy):
    proxy = start_proxy()
    memory = proxy.services.memory
    a, b = scope_key("tenant-a", "notes"), scope_key("tenant-b", "notes")
    go = threading.Event()
    order: list[str] = []
    memory.run(a, lambda: (go.wait(30), order.append("a0")))
    for i in range(1, 40):
        memory.run(a, lambda i=i: order.append(f"a{i}"))
    forgotten = memory.forget(b, query="anything")
    forgotten.add_done_callback(lambda _: order.append("forget"))  # on the writer, as it is done
    memory.run(b, lambda: order.append("b1"))
    go.set()
    assert forgotten.result(timeout=30) == []
    memory.wait()
    # Whether the writer took a0 before or after the rest was queued, b waits for one job of a's at most each time.
    assert order.index("forget") <= 2 and order.index("b1") <= 4 and len(order) == 42
    assert [o for o in order if o.startswith("a")] == [f"a{i}" for i in range(40)]  # a tenant's own jobs keep their order


def test_an_import_is_written_in_batches_and_the_wait_is_in_metrics(start_proxy):
    proxy = start_proxy()
    pages = [
        {
            "type": "Original", "id": f"p{i}", "origin": "Storage", "depth": 0, "timestamp": "2026-01-01T00:00:00",
            "keywords": ["orchard"], "summary": f"orchard {i}", "content": f"the orchard, row {i}",
        }
        for i in range(300)
    ]  # fmt: skip
    body = b"".join(json.dumps(p).encode() + b"\n" for p in pages)
    answer = proxy.http.post("/v1/pcp/memory/notes/import", content=body, headers=AUTH)
    assert answer.json() == {"imported": 300, "skipped": 0, "core_blocks": 0}
    metrics = proxy.http.get("/metrics").text
    assert metric_value(metrics, "pcp_memory_write_wait_seconds_count", kind="change") == 3  # 128 + 128 + 44
    assert "pcp_memory_pending 0" in metrics.splitlines()


def test_a_gauge_is_read_when_metrics_are_asked():
    metrics = Metrics()
    held = [3]
    metrics.gauge("pcp_memory_pending", lambda: held[0])
    assert "pcp_memory_pending 3" in metrics.exposition().splitlines()
    held[0] = 0
    assert "pcp_memory_pending 0" in metrics.exposition().splitlines()
