"""What a Detail page's XML costs beside its words, in the round-0 prompts of the LoCoMo questions.

For every question of the dev split the round engine builds its round-0
prompt in process (as ``bench/rounds.py`` does, BM25), and every Original
page the prompt shows in full (a ``<Node>`` holding a ``<Content>``, not
``type="Consolidated"``) is priced from the prompt's own text: the tokens of
the node's lines (its tags, attributes and line breaks, as the document lays
them out) less the tokens of its content. Each attribute is priced on its
own (`` name="value"``); "tags" is the rest: ``<Node``, ``<Content>``, the
closing tags and the line breaks. The turns' ``[role]`` markers are content
(the page's text), counted apart.

Reads the prompts only, so it measures any layout the proxy writes.

    .venv/bin/python bench/markup.py [--budgets 2048 4096] [--every N]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lxml import etree  # noqa: E402

from bench.recall import DEFAULT_DATA, ENCODING, load_data  # noqa: E402
from bench.rounds import worker_calls  # noqa: E402
from proxy.testing.apis import document_of  # noqa: E402
from proxy.testing.upstream import paged_session  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

_ROLE_MARKER = re.compile(r"^\[[a-z_]+\] ", re.M)


def detail_pages(document: str) -> list[tuple[str, str, dict[str, str]]]:
    """(the node's text as the prompt has it, its content as escaped there, its attributes) of each Original page in Detail."""
    pages = []
    for node in etree.fromstring(document.encode()).iter("Node"):
        content = node.find("Content")
        if content is None or node.get("type") == "Consolidated":
            continue
        written = etree.tostring(content, encoding="unicode", with_tail=False)
        pages.append((etree.tostring(node, encoding="unicode", with_tail=True), written[len("<Content>") : -len("</Content>")], dict(node.attrib)))
    return pages


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--every", type=int, default=1, help="every Nth question only")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    tokenizer = Tokenizer(ENCODING)
    count = tokenizer.count
    conversations, questions = load_data(args.data, [1, 2, 3, 4], None)
    questions = questions[:: args.every]
    sessions = {conv_id: paged_session(messages, count) for conv_id, messages in conversations.items()}
    print(f"LoCoMo {args.data.name}: {len(questions)} questions, round 0 of the engine in process (BM25)\n")
    print("| budget | Detail pages a prompt | words / page | markup / page | of which: tags | attributes | role markers / page | markup, share of the prompt |")
    print("|---|---|---|---|---|---|---|---|")
    for budget in args.budgets:
        pages = prompts = content_tokens = markup_tokens = markers = prompt_total = 0
        attributes: Counter[str] = Counter()
        for question in questions:
            calls, _ = worker_calls(sessions[question.conv_id].pages.index(), question.text, budget, tokenizer.count_built, None)
            document = document_of(calls[0]["messages"])
            prompts += 1
            prompt_total += count(document)
            for node, content, attrs in detail_pages(document):
                pages += 1
                words = count(content)
                content_tokens += words
                markup_tokens += count(node) - words
                markers += sum(count(m) for m in _ROLE_MARKER.findall(content))
                for name, value in attrs.items():
                    attributes[name] += count(f' {name}="{value}"')
        per_attribute = ", ".join(f"{name} {tokens / pages:.1f}" for name, tokens in attributes.most_common())
        tags = (markup_tokens - sum(attributes.values())) / pages
        print(
            f"| {budget:,} | {pages / prompts:.1f} | {content_tokens / pages:.1f} | **{markup_tokens / pages:.1f}** | {tags:.1f} | {per_attribute} | "
            f"{markers / pages:.1f} | {markup_tokens / prompt_total:.1%} |"
        )


if __name__ == "__main__":
    main()
