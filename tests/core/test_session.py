"""Which session a request continues, as a rule (``pcp_core.session``)."""

from __future__ import annotations

from pcp_core.session import Session, branch_id, chain_links, continuation, departs, links_continuing, longest_extended, parted_id, reconciled


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


def _asking(session_id: str, history: list[dict[str, str]], question: str) -> tuple[Session, list[str]]:
    """The session a request of ``history`` and ``question`` leaves, and the request's links (its question's last)."""
    said = chain_links([*history, {"role": "user", "content": question}])
    return Session(id=session_id, chain=said[:-1], asked=said[-1:]), said


def test_the_same_history_with_another_question_is_a_branch_and_the_same_question_goes_on():
    history = _said(6)
    found, same = _asking("s", history, "Q1?")
    _, other = _asking("s", history, "Q2?")
    follow_up = chain_links([*history, {"role": "user", "content": "Q1?"}, *_said(2, start=7)])
    assert departs(found, same) is None and departs(found, follow_up) is None  # asked again, or gone on from its answer
    assert departs(found, other) == 6
    assert [continuation(found, 6, request_links=same), continuation(found, 6, request_links=other)] == ["resumed", "forked"]
    assert continuation(found, 6) == "resumed"  # by its messages alone, as before a session kept its question
    assert departs(Session(id="old", chain=found.chain), other) is None  # a session kept without its question: goes on


def test_a_branch_is_named_by_what_it_leaves_and_where_and_only_by_that():
    history = _said(6)
    _, one = _asking("s", history, "Q1?")
    _, two = _asking("s", history, "Q2?")
    assert branch_id("ns", "s", one, 6) == branch_id("ns", "s", list(one), 6)  # the same branch, the same id
    assert len({branch_id("ns", "s", one, 6), branch_id("ns", "s", two, 6), branch_id("other", "s", one, 6), branch_id("ns", "t", one, 6)}) == 4
    assert branch_id("ns", None, one, len(one)) != branch_id("ns", "s", one, len(one))  # a new conversation is no branch


def test_of_two_questions_kept_on_one_version_the_second_is_a_branch_of_its_own():
    history = _said(6)
    winner, _ = _asking("s", history, "Q1?")
    mine, _ = _asking("s", history, "Q2?")
    again, _ = _asking("s", history, "Q1?")
    forked = reconciled(mine, winner, parted_id("ns", mine, winner))
    assert forked is not None and forked.id == parted_id("ns", mine, winner) != "s" and forked.asked == mine.asked
    assert reconciled(again, winner, parted_id("ns", again, winner)) is None  # the same request twice: one session
    went_on, _ = _asking("s", [*history, {"role": "user", "content": "Q1?"}, {"role": "assistant", "content": "A1."}], "Q3?")
    assert reconciled(went_on, winner, "unused") == went_on  # it goes on from the winner's question
