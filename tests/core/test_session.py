"""Which session a request continues, as a rule (``pcp_core.session``)."""

from __future__ import annotations

from pcp_core.session import Session, chain_links, links_continuing, longest_extended


def _said(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(start, start + n)]


def _session(session_id: str, messages: list[dict[str, str]]) -> Session:
    return Session(id=session_id, chain=chain_links(messages))


def test_a_follow_up_links_only_its_new_messages_and_reuses_what_the_session_holds():
    earlier = _said(6)
    found = _session("s", earlier)
    follow_up = [*earlier, *_said(3, start=6)]
    links, reused = links_continuing(found, follow_up, history=8, known=6)
    assert links == chain_links(follow_up)  # the same chain as hashing every message again
    assert reused == 6


def test_a_conversation_edited_before_the_session_ends_reuses_only_the_shared_prefix():
    earlier = _said(6)
    found = _session("s", earlier)
    edited = [*earlier[:4], {"role": "user", "content": "something else"}, *_said(2, start=5)]
    links, reused = links_continuing(found, edited, history=6, known=4)
    assert links == chain_links(edited)
    assert reused == 4


def test_the_longest_session_a_chain_extends_is_chosen():
    messages = _said(10)
    chain = chain_links(messages)
    short, long, other = _session("short", messages[:3]), _session("long", messages[:7]), _session("other", _said(8, start=50))
    assert longest_extended(chain, [short, other, long]).id == "long"
    assert longest_extended(chain[:5], [short, long, other]).id == "short"  # "long" is not within reach
    assert longest_extended(chain, [other]) is None
