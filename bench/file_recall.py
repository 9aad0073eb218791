"""Evidence recall from a pasted file: each LoCoMo conversation sent as one Markdown message.

The same questions as ``bench/recall.py``, but the whole conversation arrives
as a single user message — a transcript file, one ``## Session N - <date>``
heading per session and one line per turn — followed by "Kept it." and the
question. That is the shape of a pasted document or a long tool output.
Three ways of paging it are compared, through the real proxy and the
simulated worker:

* File block (``block_tokens=1500``, the default): the message is a PBlock,
  scanned into Draft pages by its sections (each dated by its heading) and
  lines; the Router ranks the drafts;
* turns (``block_tokens=0``): the message is paged as one long turn, cut into
  pages of consecutive words;
* File block in the query: the file and the question in one message, the
  first of the conversation (the query is the block).

A question is recalled when every line of each of its evidence turns is in the
``<Content>`` of a worker prompt: round 0's, any of the request's, one of them,
or the one the worker answered from (the rows of ``bench/recall.py``).

    .venv/bin/python bench/file_recall.py [--budgets 2048 4096] [--limit N] [--embeddings]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import DEFAULT_DATA, ENCODING, LEGEND, Message, Question, asked, category_counts, load_data, load_worker, markdown_table, run_proxy, user  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

HEADER = re.compile(r"^\[(?P<title>[^\]\n]+)\]\n")
INTRO = "Here is the transcript of all our chats so far, as a file. Keep it for reference."


def spoken(content: str) -> str:
    """A turn's text without the session header that opens the first turn of a session."""
    return HEADER.sub("", content, count=1)


def as_file(messages: Sequence[Message]) -> list[Message]:
    """The conversation as one Markdown transcript message, then the assistant's "Kept it."."""
    lines = [INTRO]
    for message in messages:
        header = HEADER.match(message["content"])
        if header:
            lines += ["", f"## {header.group('title')}", ""]
        lines.append(spoken(message["content"]))
    return [user("\n".join(lines)), {"role": "assistant", "content": "Kept it."}]


def file_needles(originals: dict[str, list[Message]]):
    """The lines each question's evidence turns show as in the file."""
    from pcp_core.prompt.markup import xml_safe

    def needles(question: Question, _sent: Sequence[Message]) -> list[str]:
        turns = originals[question.conv_id]
        return [xml_safe(line) for i in question.evidence for line in spoken(turns[i]["content"]).split("\n") if line.strip()]

    return needles


def with_the_question(messages: Sequence[Message], question: Question) -> list[Message]:
    """The file and the question as one message: the query is the block."""
    return [user(f"{messages[0]['content']}\n\n{question.text}")]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--limit", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--categories", type=int, nargs="+", default=[1, 2, 3, 4], choices=[1, 2, 3, 4, 5])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embeddings", action="store_true", help="dense recall fused with BM25")
    parser.add_argument("--worker", choices=["flow", "background"], default="flow")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    count = Tokenizer(ENCODING).count
    originals, questions = load_data(args.data, args.categories, args.limit)
    files = {conv_id: as_file(messages) for conv_id, messages in originals.items()}
    sizes = sorted(count(messages[0]["content"]) for messages in files.values())
    print(
        f"LoCoMo {args.data.name} as files: {len(files)} files of {sizes[0]:,}–{sizes[-1]:,} tokens, {len(questions)} questions ({category_counts(questions, args.categories)})\n"
    )
    for budget in args.budgets:
        rows, notes = [], []
        for label, block_tokens, compose in (("File block", 1500, asked), ("turns", 0, asked), ("File block in the query", 1500, with_the_question)):
            more, stats = run_proxy(
                files,
                questions,
                budget,
                count,
                load_worker(args.worker),
                args.embeddings,
                needles=file_needles(originals),
                compose=compose,
                label=label,
                block_tokens=block_tokens,
            )
            rows += more
            over = sum(o.max_prompt > budget for o in more[1].outcomes)
            notes.append(f"{label}: {stats.summary(budget, over)}")
        print(markdown_table(budget, rows, args.categories))
        print("\n" + "\n".join(notes) + "\n")
    print(LEGEND)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
