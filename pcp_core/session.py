"""Session continuity: the proxy recognises a conversation the client sends again.

The chat API is stateless, so every request resends the whole history. A hash
chain over the conversation's messages names each prefix of it: link ``i``
digests message ``i`` and link ``i - 1``. The host remembers which session each
link belongs to; the longest known prefix of a request names its session, the
pages of that prefix are reused, and only the messages after it are paged.

A request that extends its session continues it. One that shares only part of
it — the client edited or dropped earlier messages — forks a new session from
the common prefix, so the other branch keeps its pages. A session the client
pins by id (``x-pcp-session``) follows the client instead: it is rebuilt in place.

A session also knows the question it answered last (``Session.asked``, the links
of the request's last message, as sent): a request that sends the same history with
another last message (a question edited or asked again differently, one of a
sub-agent's branches) leaves the session there and is a branch of its own, as
its follow-up will be: the host finds a branch by the question it answered.
A session that does not continue the one it was found from is named by that
one and the first link it does not share with it (``branch_id``): requests
that take the same branch at once, in one process or several, name the same
session.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from .pages.blocks import PBlock
from .pages.logical import Page, Turn, short_hash
from .paging.history import PagedHistory, PagingPolicy, page_history, reopened_from, turns_from_messages
from .prompt.frame import Frame
from .text.timeline import stated_time
from .text.tokens import Checkpoint, CountText, unchecked

__all__ = [
    "SESSION_ID",
    "Continuation",
    "Session",
    "begins_with",
    "branch_id",
    "branch_probes",
    "chain_links",
    "client_named",
    "common_prefix",
    "continuation",
    "departs",
    "identity",
    "links_continuing",
    "hold",
    "longest_extended",
    "new_session_id",
    "page_on",
    "parted_id",
    "reconciled",
    "resume",
    "solidified",
    "transcript",
    "turns_to_page",
]

# What a client may send as a session id: short, printable, safe in a header and a key.
# \A…\Z, not ^…$: "$" also matches before a final newline, and "alice\n" is no id.
SESSION_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation the proxy keeps: a value, replaced (never changed) as the conversation goes on."""

    id: str
    chain: list[str] = []  # chain[i] names messages 0..i of the conversation
    seen_at: list[str] = []  # when the proxy first saw message i: its turn's timestamp
    pages: PagedHistory = msgspec.field(default_factory=PagedHistory)
    # The messages that state a date (position -> that time): the Timeline's
    # carry, so a follow-up reads only its new messages, not the whole history.
    # None: not known (a session saved before dates were kept).
    dates: dict[int, str] | None = None
    # The head of its document as the last request rendered it (``pcp_core.prompt.frame``): the next
    # request that goes on from it replays it byte for byte, a prefix a provider's cache reuses.
    frame: Frame | None = None
    # The links of the messages that followed the chain in the request that kept it last: the
    # question it answered (none, or the chain holds it, a File block). A follow-up sends them
    # again after the chain and goes on; a request with another question there is a branch.
    asked: list[str] = []


def chain_links(messages: Sequence[Mapping[str, Any]], after: str = "") -> list[str]:
    """One link per message; equal links mean equal conversations up to there.

    ``after``: the last link of the messages before these, whose chain these continue.
    """
    links, previous = [], bytes.fromhex(after)
    for message in messages:
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(msgspec.json.encode(message, order="sorted"))  # key order is not content
        previous = digest.digest()
        links.append(previous.hex())
    return links


def transcript(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """The messages as one canonical JSON array: equal bytes for equal conversations.

    Encoding a long history is one call in C, where its chain is a hash per
    message in Python: a follow-up recognises the conversation it continues
    by its transcript (``begins_with``) and links only its new messages.
    """
    return msgspec.json.encode(messages, order="sorted")


def begins_with(transcript: bytes, earlier: bytes) -> bool:
    """Whether the conversation of ``transcript`` opens with every message of ``earlier`` (at least one)."""
    end = len(earlier) - 1  # ``earlier`` without its closing bracket
    return end > 1 and transcript[end : end + 1] in (b",", b"]") and transcript.startswith(memoryview(earlier)[:end])


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many links two chains share from the start (or texts two lists of them)."""
    n = min(len(a), len(b))
    a, b = list(a[:n]), list(b[:n])
    if a == b:  # compared in C: one usually extends the other
        return n
    same, differs = 0, n  # a[:same] == b[:same], a[:differs] != b[:differs]
    while differs - same > 1:
        mid = (same + differs) // 2
        if a[same:mid] == b[same:mid]:
            same = mid
        else:
            differs = mid
    return same


def links_continuing(found: Session, chained: Sequence[Mapping[str, Any]], history: int, known: int) -> tuple[list[str], int]:
    """Which session a request continues, as a rule: a conversation whose first ``known`` messages are
    ``found``'s (recognised by their transcript, or by the link of message ``known``) continues it there.

    Gives the conversation's chain (``found``'s first ``known`` links, then the
    rest linked after them: only the new messages are hashed) and how many of
    its ``history`` messages ``found`` holds (``reused``: where its paging goes on).
    """
    chain = found.chain
    links = [*chain[:known], *chain_links(chained[known:], after=chain[known - 1] if known else "")]
    return links, common_prefix(chain, links[:history])


def identity(session: Session) -> list[str]:
    """What a session holds, as links: its chain, then the question it answered."""
    return [*session.chain, *session.asked] if session.asked else session.chain


def departs(found: Session, request_links: Sequence[str]) -> int | None:
    """Where a request of links ``request_links`` (its chain's, then its question's) leaves ``found``:
    the first of its links ``found`` does not hold; None when it goes on from ``found`` (holds all of it)."""
    held = identity(found)
    shared = common_prefix(held, request_links)
    return None if shared == len(held) else shared


def branch_id(namespace: str, parent: str | None, request_links: Sequence[str], at: int) -> str:
    """The id of the session a request of links ``request_links`` starts by leaving ``parent`` at ``at`` (None,
    ``len(request_links)``: it found none), as a rule: named by its parent and its first link of its own (its last, when
    all of them are the parent's), so that requests that take the same branch name the same session."""
    return "s-" + short_hash(namespace, *([parent] if parent is not None else []), request_links[min(at, len(request_links) - 1)], length=16)


def branch_probes(request_links: Sequence[str], at: int) -> list[int]:
    """Where the branch a request of links ``request_links`` goes on in may have started, for a request that
    leaves the session it found at ``at``: a question asked at ``at`` (a branch of it there), or one that ends
    just before it (a question asked again at an earlier point)."""
    return sorted({min(at, len(request_links) - 1), *([at - 1] if at > 0 else [])}, reverse=True)


def parted_id(namespace: str, mine: Session, winner: Session) -> str:
    """The id ``mine`` goes on under when ``winner`` was kept first under its id and they went apart (``reconciled``)."""
    mine_links = identity(mine)
    return branch_id(namespace, winner.id, mine_links, common_prefix(mine_links, identity(winner)))


def longest_extended(chain: Sequence[str], sessions: Iterable[Session]) -> Session | None:
    """The longest of ``sessions`` that ``chain`` extends (its link at that session's length is the session's last)."""
    best: Session | None = None
    for session in sessions:
        n = len(session.chain)
        if 0 < n <= len(chain) and chain[n - 1] == session.chain[-1] and (best is None or n > len(best.chain)):
            best = session
    return best


Continuation = Literal["pinned", "resumed", "forked", "new"]


def continuation(found: Session | None, reused: int, *, pinned: bool = False, request_links: Sequence[str] | None = None) -> Continuation:
    """How a request goes on from ``found``, which holds its first ``reused`` messages.

    ``pinned``: the client named the session; ``resumed``: the request extends
    it; ``forked``: it shares only a prefix, or (``request_links``: the request's links,
    its question's last) it asks another question after the same history;
    ``new``: nothing was found.
    """
    if pinned:
        return "pinned"
    if found is None:
        return "new"
    goes_on = reused == len(found.chain) if request_links is None else departs(found, request_links) is None
    return "resumed" if goes_on else "forked"


def resume(
    found: Session | None, reused: int, chain: list[str], now: str, fresh_id: str, *, pinned: bool = False, request_links: Sequence[str] | None = None
) -> Session:
    """The session this request continues, with its chain and first-seen times (pages not yet extended).

    ``found`` shares the first ``reused`` messages with the request. It goes on
    when the request extends it or the client pinned it; otherwise the request
    forks a session of its own (``fresh_id``) that starts from the shared pages.
    ``request_links``: the request's links, its question's last (``continuation``).
    """
    if found is None:
        return Session(id=fresh_id, chain=chain, seen_at=[now] * len(chain), dates={})
    seen_at = [*found.seen_at[:reused], *[now] * (len(chain) - reused)]
    extends = continuation(found, reused, pinned=pinned, request_links=request_links) in ("pinned", "resumed")
    dates = None if found.dates is None else {i: time for i, time in found.dates.items() if i < reused}
    return Session(id=found.id if extends else fresh_id, chain=chain, seen_at=seen_at, pages=found.pages, dates=dates, frame=found.frame)


def page_on(
    session: Session,
    messages: Sequence[Mapping[str, Any]],
    reused: int,
    count: CountText,
    policy: PagingPolicy = PagingPolicy(),
    checkpoint: Checkpoint = unchecked,
) -> Session:
    """``session`` with the pages of ``messages``, paged on from the ``reused`` messages it holds (its pages are kept as they are)."""
    turns, dates = turns_to_page(session, messages, reused)
    pages = page_history(turns, count, policy, session.pages, reused, checkpoint)
    return msgspec.structs.replace(session, pages=pages, dates=dates)


def turns_to_page(session: Session, messages: Sequence[Mapping[str, Any]], reused: int) -> tuple[list[Turn], dict[int, str]]:
    """The turns of ``messages`` that paging reads again (from where the last kept page starts), and the dates the messages state."""
    start = reopened_from(session.pages, reused)
    # Dates not known (an older session): read from the first message, once, to learn them.
    known, read = (session.dates, start) if session.dates is not None else ({}, 0)
    before = [i for i in known if i < read]
    turns = turns_from_messages(messages[read:], session.seen_at[read:], read, known[max(before)] if before else None)
    dates = {i: time for i, time in known.items() if i < read}
    dates.update((turn.index, time) for turn in turns if (time := stated_time(turn.text)))
    return [turn for turn in turns if turn.index >= start], dates


def hold(session: Session, link: str, query: Turn, block: PBlock) -> Session:
    """``session`` with the query, a File block, as its next message, scanned.

    The follow-up sends that message back as history: it finds the block
    there and does not scan it again, and keeps what this answer read
    (solidified), even when the file was the conversation's first message.
    """
    pages = msgspec.structs.replace(session.pages, blocks=[*session.pages.blocks, block])
    return msgspec.structs.replace(session, chain=[*session.chain, link], seen_at=[*session.seen_at, query.timestamp], pages=pages)


def solidified(session: Session, pages: Sequence[Page]) -> Session:
    """``session`` keeping the formal pages its drafts were solidified into (§VI.5); the same session if it holds them all."""
    known = {page.id for page in session.pages.storage}
    new = [page for page in pages if page.id not in known]
    if not new:
        return session
    return msgspec.structs.replace(session, pages=msgspec.structs.replace(session.pages, storage=[*session.pages.storage, *new]))


def reconciled(mine: Session, winner: Session, fresh_id: str, *, pinned: bool = False) -> Session | None:
    """What a request keeps when another request kept ``winner`` under its session's id since it read it.

    Both paged on from the same session, each its own new messages; nothing is paged again:

    * the winner holds every message ``mine`` does, and the question it
      answered: the winner stays, with the pages ``mine`` solidified (None: it
      holds those too, nothing to keep);
    * ``mine`` holds every message of the winner's and more: ``mine``, with
      the pages the winner solidified;
    * they went apart (two branches of one conversation, or two questions
      asked after one history): ``mine`` goes on under an id of its own
      (``fresh_id``: ``parted_id``), a fork, and the winner keeps the id —
      unless the client pinned the id: a pinned session follows the client,
      and ``mine`` replaces it.
    """
    mine_links, held = identity(mine), identity(winner)
    shared = common_prefix(mine_links, held)
    if shared == len(mine_links):
        merged = solidified(winner, mine.pages.storage)
        return None if merged is winner else merged
    if shared == len(held) or pinned:
        return solidified(mine, winner.pages.storage) if shared == len(held) else mine
    return msgspec.structs.replace(mine, id=fresh_id)


def client_named(client_session: str, first: Mapping[str, Any] | None) -> str | None:
    """The session of a request whose client names a session of its own (a coding agent's ``X-Claude-Code-Session-Id``),
    as a rule: one per client session and first message of the conversation (``first``: None, the request has none).

    Two agents given the same task start alike (the task, the same instructions:
    only their heads, which a session does not hold, tell their folders apart), and
    sessions found by content would be one until they part. Named by the client,
    they are two from the start; a client's other conversations (a sub-agent's,
    whose first message is its own task) keep theirs.
    """
    return None if first is None else "c-" + short_hash(client_session, chain_links([first])[0], length=16)


def new_session_id(namespace: str, chain: Sequence[str], nonce: int) -> str:
    """The id of a session a request starts (``nonce``: the time in ns, say): ids never repeat, even for one conversation."""
    return "s-" + short_hash(namespace, *chain[:1], str(nonce), length=16)
