"""A scripted protocol-mode conversation, and what its worker prompts show, for the telemetry tests."""

from __future__ import annotations

from lxml import etree

from pcp_core.prompt.markup import node_view
from proxy.testing.apis import worker_document
from proxy.testing.upstream import Recorded, Reply, completion, stream_reply

TOPICS = [
    "the allotment and its seedlings",
    "the choir's spring concert",
    "a leaking kitchen tap",
    "the trip to Lisbon",
    "a chess opening",
    "the new espresso grinder",
    "grandma's birthday cake",
    "the office move",
]


def dated_chat(turns: int = 160, question: str = "What is my gym locker code?") -> list[dict]:
    """A long chat over several topics, a day for each two (a dated line opens it), with one fact (the locker code) said once, and a question."""
    messages = [{"role": "system", "content": "You are a friendly assistant."}]
    for i in range(turns):
        topic = TOPICS[(i // 12) % len(TOPICS)]
        text = f"Turn {i}: more about {topic}, remark {i % 7} of many."
        if i % 24 == 0:
            text = f"[2024-03-{1 + i // 24:02} 10:00]\n{text}"
        if i == 40:
            text = "Turn 40: my locker code at the gym is 5521, don't tell anyone."
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    messages.append({"role": "user", "content": question})
    return messages


def document(recorded: Recorded) -> etree._Element:
    """The <PagedContext> of a worker call."""
    return etree.fromstring(worker_document(recorded))


def flow_views(recorded: Recorded) -> dict[str, str]:
    """Each Node of the call's Linear_Flow (nested ones too) and the view the worker reads it at."""
    flow = document(recorded).find("Linear_Flow")
    return {node.get("id"): node_view(node) for node in flow.iter("Node")}


def consult_first_summary(recorded: Recorded) -> Reply:
    """A worker that opens the first page it was shown by its summary (streamed when the call asks for a stream)."""
    target = next(page for page, view in flow_views(recorded).items() if view == "Summary")
    text = f'I need more. Consult("look closer", "{target}")'
    return stream_reply([text]) if recorded.json.get("stream") else completion(text)


def consulted_in(recorded: Recorded) -> list[str]:
    """The targets of the Consult steps a call's Reasoning_Trace shows."""
    return [step.get("target") for step in document(recorded).iter("Step") if step.get("action") == "Consult"]
