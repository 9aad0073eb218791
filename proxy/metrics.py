"""Counters of what the proxy did, served at ``GET /metrics`` in the Prometheus text format."""

from __future__ import annotations

from collections import Counter

__all__ = ["HELP", "Metrics"]

HELP = {
    "pcp_requests_total": "Chat completion requests, by mode (passthrough | protocol).",
    "pcp_sessions_total": "Protocol-mode requests by how they found their session (new | resumed | forked | pinned).",
    "pcp_turns_paged_total": "Messages paged in protocol mode; those a session already held are not paged again.",
    "pcp_pages_built_total": "Pages built by paging, by type (Original | Consolidated); reused pages are not counted.",
    "pcp_summaries_total": "Model summaries of pages (PCP_CONSOLIDATOR=llm) by state: queued, then landed or failed; cached when the disk had it.",
    "pcp_pages_solidified_total": "Draft pages of PBlocks (large messages) the worker read, solidified into pages the session keeps (§VI.5).",
    "pcp_upstream_calls_total": "Calls the proxy made upstream on its own behalf, by x-pcp-role.",
    "pcp_texts_embedded_total": "History texts for dense recall, by state: queued for the background thread, then encoded, loaded (from disk) or failed.",
    "pcp_memory_pages_written_total": "Pages written into memory (write-backs, merges, imports); a page memory held already is not counted.",
    "pcp_memory_recalled_total": "Memory pages the Memory Router gave requests.",
    "pcp_memory_merged_total": "Consolidated pages the Memory Consolidator made over alike pages of different conversations.",
}


class Metrics:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        assert name in HELP, f"undeclared metric {name}"
        self.counts[(name, tuple(sorted(labels.items())))] += amount

    def value(self, name: str, **labels: str) -> int:
        return self.counts[(name, tuple(sorted(labels.items())))]

    def exposition(self) -> str:
        lines = []
        for name, help_text in HELP.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            for (metric, labels), value in sorted(self.counts.items()):
                if metric == name:
                    rendered = ",".join(f'{k}="{v}"' for k, v in labels)
                    lines.append(f"{name}{{{rendered}}} {value}" if rendered else f"{name} {value}")
        return "\n".join(lines) + "\n"
