"""Counters and histograms of what the proxy did, served at ``GET /metrics`` in the Prometheus text format."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable

__all__ = ["GAUGES", "HELP", "HISTOGRAMS", "Metrics"]

HELP = {
    "pcp_requests_total": "Requests under /v1, by mode: passthrough (forwarded as they came: every path, and chat completions below the threshold) | protocol (paged and answered; one that fails is in pcp_requests_failed_total).",
    "pcp_requests_failed_total": "Protocol-mode requests that ended in an error (the upstream's, or the proxy's), by status; not counted in pcp_requests_total, their session not kept.",
    "pcp_sessions_total": "Protocol-mode requests by how they found their session (new | resumed | forked | pinned).",
    "pcp_turns_paged_total": "Messages paged in protocol mode; those a session already held are not paged again.",
    "pcp_pages_built_total": "Pages built by paging, by type (Original | Consolidated); reused pages are not counted.",
    "pcp_summaries_total": "Model summaries of pages (PCP_SUMMARIES=llm) by state: queued, then landed or failed; cached when the disk had it.",
    "pcp_pages_solidified_total": "Draft pages of PBlocks (large messages) the worker read, solidified into pages the session keeps (§VI.5).",
    "pcp_upstream_calls_total": "Calls the proxy made upstream on its own behalf, by x-pcp-role.",
    "pcp_paging_stopped_total": "Pagings stopped before their end, by reason: paging_timeout (a 413), or cancelled (the client left, or request_timeout passed).",
    "pcp_context_rounds_total": "Hybrid-mode rounds (requests with the mode enabled) by outcome: read (the answer's snapshot kept) | kept (none could be read: the previous one stands).",
    "pcp_context_violations_total": "Hybrid-mode rules an answer broke, by rule (the proxy restored, repaired or dropped what broke them; the log names each at debug).",
    "pcp_context_cold_total": "Hybrid-mode memory blocks by event: sent (kept aside as a tag_ref placeholder, the snapshot over its share) | rehydrated (brought back for a query naming their tags).",
    "pcp_texts_embedded_total": "History texts for dense recall, by state: queued for the background thread, then encoded, loaded (from the store), elsewhere (another process claimed them), failed, or shed (past the queue's share of cache_mb: queued again when a request ranks them).",
    "pcp_session_conflicts_total": "Session saves that found another request's save first, by what was kept: winner (it held this one's messages) | extended (this one held the winner's, and more) | forked (two branches: this one under an id of its own) | replaced (a pinned session follows its client).",
    "pcp_memory_pages_written_total": "Pages written into memory (write-backs, merges, imports); a page memory held already is not counted.",
    "pcp_memory_recalled_total": "Memory pages the Memory Router gave requests.",
    "pcp_billed_input_tokens_total": "Protocol mode: input as providers bill it with a prompt cache (cached tokens at cached_input_price), in uncached-token units, by request: paged (as sent) | untouched (the same requests as the client sent them).",
    "pcp_input_tokens_total": "Protocol mode: input tokens by request (paged: as sent, every worker call | untouched: the same requests as the client sent them, where they fit the model's window) and by cache: cached (read from the provider's prompt cache, billed at cached_input_price) | uncached.",
    "pcp_requests_not_comparable_total": "Protocol-mode requests larger than the model's known window: they could not have gone untouched, so no untouched bill or saving is counted for them (their paged bill is).",
    "pcp_memory_merged_total": "Consolidated pages the Memory Consolidator made over alike pages of different conversations.",
}

# Seconds: from a loopback passthrough (milliseconds) to a protocol-mode request with a real model (minutes).
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "pcp_request_seconds": ("Seconds from a request's arrival until its response starts (a whole answer, or a stream's first event), by mode.", _SECONDS),
    "pcp_rounds_per_request": ("Worker calls made for one protocol-mode request.", (1, 2, 3, 4, 5, 6, 8, 10, 16)),
    "pcp_tokens_saved_per_request": (
        "Protocol mode: billed input saved against the same request sent untouched, priced with a prompt cache (x-pcp-tokens-saved; negative when paging cost more).",
        (-8_000, -4_000, -2_000, -1_000, 0, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000),
    ),
    "pcp_upstream_seconds": ("Seconds of one call the proxy made upstream on its own behalf, by x-pcp-role, until its answer's last byte.", _SECONDS),
    "pcp_memory_write_wait_seconds": (
        "Seconds a memory write waited in its tenant's queue before the writer took it, by kind (write_back | ingest | recalled | forget | change: an import batch, a drop).",
        _SECONDS,
    ),
}
# Values read when /metrics is asked, not counted.
GAUGES = {
    "pcp_memory_pending": "Memory writes queued or running on the memory's writer, every tenant's (write-backs, forgets, import batches).",
    # What the caches bounded by cache_mb hold (estimated, proxy.resident), and the encoder's weights once loaded.
    "pcp_resident_sessions_bytes": "Bytes of the sessions kept decoded in memory, with the transcripts follow-ups find them by (estimated).",
    "pcp_resident_texts_bytes": "Bytes of what is kept by the conversations' texts: their counts, pages' texts and terms (estimated; forgotten past its share as sessions leave memory).",
    "pcp_resident_bodies_bytes": "Bytes of the chat bodies read last, whose messages a follow-up does not decode again (estimated).",
    "pcp_resident_vectors_bytes": "Bytes of the history texts' vectors kept in memory for dense recall.",
    "pcp_resident_bm25_bytes": "Bytes of the BM25 indexes kept for the conversations' follow-ups, and of their texts' terms (estimated).",
    "pcp_resident_memory_bytes": "Bytes of the memory scopes' indexes open in memory (estimated).",
    "pcp_resident_queue_bytes": "Bytes of the history texts waiting for the background to encode them.",
    "pcp_resident_encoder_bytes": "Bytes of the dense-recall encoder's weights, once a request has loaded it (0 before).",
}

Labels = tuple[tuple[str, str], ...]


class _Histogram:
    """One histogram series: counts per bucket (not cumulative until rendered), their sum and count."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count ``value`` in its bucket, and in the sum and count."""
        self.counts[bisect_left(self.buckets, value)] += 1  # a value on a bound belongs to it (le)
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: Labels) -> list[str]:
        """The histogram's exposition lines: its cumulative buckets, sum and count."""
        shown = "".join(f'{k}="{v}",' for k, v in labels)
        rows, total = [], 0
        for bound, n in zip([*map(_number, self.buckets), "+Inf"], self.counts, strict=True):
            total += n
            rows.append(f'{name}_bucket{{{shown}le="{bound}"}} {total}')
        plain = f"{{{shown.rstrip(',')}}}" if labels else ""
        return [*rows, f"{name}_sum{plain} {_number(self.sum)}", f"{name}_count{plain} {self.count}"]


def _number(value: float) -> str:
    """A value as Prometheus writes it: an integer without its decimal point."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Metrics:
    """Counters and histograms, written from the event loop and from threads (the rounds, the
    stores' writers, the encoder's background): a lock keeps every count."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, Labels]] = Counter()
        self.histograms: dict[tuple[str, Labels], _Histogram] = {}
        self.gauges: dict[str, Callable[[], float]] = {}
        self.lock = threading.Lock()

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """Show ``read()`` as the gauge ``name`` (one of ``GAUGES``) whenever /metrics is asked."""
        assert name in GAUGES, f"undeclared gauge {name}"
        self.gauges[name] = read

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        """Add ``amount`` to the counter ``name`` with these labels."""
        assert name in HELP, f"undeclared metric {name}"
        key = (name, tuple(sorted(labels.items())))
        with self.lock:
            self.counts[key] += amount

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Count ``value`` into the histogram ``name`` (one of ``HISTOGRAMS``) under ``labels``."""
        key = (name, tuple(sorted(labels.items())))
        with self.lock:
            series = self.histograms.get(key)
            if series is None:
                series = self.histograms[key] = _Histogram(HISTOGRAMS[name][1])
            series.observe(value)

    def value(self, name: str, **labels: str) -> int:
        """The counter ``name`` with these labels, as it stands."""
        return self.counts[(name, tuple(sorted(labels.items())))]

    def exposition(self) -> str:
        """Every counter and histogram in Prometheus's text format."""
        with self.lock:  # a thread may add a series meanwhile
            counts = sorted(self.counts.items())
            histograms = sorted(self.histograms.items(), key=lambda item: item[0])
        lines = []
        for name, help_text in HELP.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            for (metric, labels), value in counts:
                if metric == name:
                    rendered = ",".join(f'{k}="{v}"' for k, v in labels)
                    lines.append(f"{name}{{{rendered}}} {value}" if rendered else f"{name} {value}")
        for name, help_text in GAUGES.items():
            read = self.gauges.get(name)
            if read is not None:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {_number(read())}"]
        for name, (help_text, _) in HISTOGRAMS.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            for (metric, labels), series in histograms:
                if metric == name:
                    lines += series.lines(name, labels)
        return "\n".join(lines) + "\n"
