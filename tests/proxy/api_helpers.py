"""What the tests of the paged APIs share: the worker's document, wherever the API puts it, and a worker that Consults."""

from __future__ import annotations

from collections.abc import Callable

from lxml import etree

from pcp_core.prompt.markup import node_view
from proxy.testing.apis import answer, api_of, worker_document
from proxy.testing.upstream import Recorded, Reply


def document(recorded: Recorded) -> etree._Element:
    return etree.fromstring(worker_document(recorded))


def consult(stream: bool) -> Callable[[Recorded], Reply]:
    """A worker that Consults the first page shown by its summary, in the API it is called in (100 tokens in, 7 out)."""

    def reply(recorded: Recorded) -> Reply:
        target = next(n.get("id") for n in document(recorded).iter("Node") if node_view(n) == "Summary")
        return answer(api_of(recorded), f'Consult("look closer", "{target}")', stream=stream, input_tokens=100, output_tokens=7)

    return reply
