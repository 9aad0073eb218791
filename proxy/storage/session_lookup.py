"""Finding a request's session: the reading half of ``SessionStore`` (``sessions``), blocking: call it from a thread.

A follow-up is found in memory by its history's transcript, or in the store by
the digests of its history's last prefixes; otherwise by its chain's links,
in memory and then in the store. A request that leaves the session it was
found by goes on in the branch that asked its question, if one was kept.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import NamedTuple

import msgspec

from pcp_core import (
    Conversation,
    Resolution,
    Session,
    begins_with,
    branch_id,
    branch_probes,
    chain_links,
    common_prefix,
    departs,
    identity,
    links_continuing,
    longest_extended,
    question_links,
    transcript,
)

from .base import Store
from .recent_sessions import Held as _Held
from .recent_sessions import RecentSessions
from .session_parts import TRANSCRIPTS, Layout, prefix_digests

__all__ = ["LINK_STRIDE", "Kept", "SessionLookup"]

# Links go to the store for the first LINK_STRIDE messages, every LINK_STRIDE-th
# after them and a session's last one: a 200k-token history's first write is
# some 300 entries, not 5,000. A lookup probes the last LINK_STRIDE positions
# (where a follow-up's known end lies) and every stored position before them;
# the session's full chain then gives the exact common prefix.
LINK_STRIDE = 16
READS = 3  # a session read while another process writes it is read again, this many times at most
BRANCH_HOPS = 4  # a request that leaves the session it was found by looks this many branches further, at most


class Kept(NamedTuple):
    """A session as the store holds it, and the version it holds it at."""

    session: Session
    version: str


class SessionLookup:
    """The sessions' store and the recent ones in memory, as a request's lookup reads them."""

    store: Store
    shared: bool
    layout: Layout
    recent: RecentSessions
    pending: Future[Kept | None] | None

    def resolve(self, namespace: str, conversation: Conversation, pinned: str | None = None) -> Resolution:
        """The session the request's chained messages continue: the pinned one, or the longest known prefix's
        (when the request leaves that one, the branch it goes on in, if one of its requests was kept before).

        A follow-up is found in memory by its history's transcript, or in the
        store by the digests of its history's last prefixes, and only its new
        messages are linked; otherwise the whole chain is linked and looked up,
        in memory and then in the store.
        """
        found = self._found(namespace, conversation, pinned)
        resolution = msgspec.structs.replace(found, asked=question_links(conversation, found.links))
        return resolution if pinned is not None else self._branched(namespace, conversation, resolution)

    def _found(self, namespace: str, conversation: Conversation, pinned: str | None) -> Resolution:
        """The session the request's messages continue, before branches are looked at: by transcript, by pin, or by chain."""
        chained = conversation.chained
        if pinned is None and conversation.history:
            text = transcript(conversation.history)
            held = self._continued(namespace, text)
            if held is not None:
                links, reused = links_continuing(held.session, chained, len(conversation.history), len(held.session.chain))
                return Resolution(found=held.session, reused=reused, links=links, version=held.version)
            found = self._by_transcript(namespace, conversation, text)
            if found is not None:
                return found
        links = chain_links(chained)
        history = links[: len(conversation.history)]
        if pinned is not None:
            kept = self._load(namespace, pinned)
            if kept is None:
                return Resolution(links=links, pinned=pinned)
            return Resolution(found=kept.session, reused=common_prefix(kept.session.chain, history), links=links, pinned=pinned, version=kept.version)
        kept, reused = self._find(namespace, history)
        return Resolution(found=kept.session if kept else None, reused=reused, links=links, version=kept.version if kept else "")

    def _branched(self, namespace: str, conversation: Conversation, resolution: Resolution) -> Resolution:
        """The branch the request goes on in, when it leaves the session it was found by.

        Branches of one history hold the same messages (they differ in the
        question each answered, ``Session.asked``): which of them a lookup
        finds first says nothing. A branch is found by the question it
        answered (at ``at``, or just before it: a question asked again at an
        earlier point), or by the id it took leaving the session found (``branch_id``).
        """
        links, history = resolution.request_links, resolution.links[: len(conversation.history)]
        for _ in range(BRANCH_HOPS):
            found = resolution.found
            at = departs(found, links) if found is not None else None
            if found is None or at is None:
                return resolution
            better = None
            for i in branch_probes(links, at):
                for session_id in dict.fromkeys([branch_id(namespace, found.id, links, i), *self._asking(namespace, links[i])]):
                    kept = self._load(namespace, session_id) if session_id != found.id else None
                    if kept is None:
                        continue
                    held = identity(kept.session)
                    shared = common_prefix(held, links)
                    if shared > at or shared == at == len(held):  # it leaves this one later, or goes on from it
                        better = kept
                        break
                if better is not None:
                    break
            if better is None:
                if len(found.chain) <= at < len(history):
                    # It went on from the question ``found`` answered, sent again otherwise (a client that
                    # rewrites its own message), and no branch asked it so: the same conversation, going on.
                    return msgspec.structs.replace(resolution, found=msgspec.structs.replace(found, asked=[]))
                return resolution
            reused = common_prefix(better.session.chain, history)
            resolution = Resolution(found=better.session, reused=reused, links=resolution.links, version=better.version, asked=resolution.asked)
        return resolution

    def _asking(self, namespace: str, link: str) -> list[str]:
        """The sessions whose last question opens with ``link`` (``Session.asked``): those in memory, else the one the store knows."""
        held = [session_id for session_id, held in self.recent.of(namespace).items() if held.session.asked[:1] == [link]]
        if held:
            return held
        stored = self.store.get(("asked", namespace, link))
        return [stored.decode()] if stored is not None else []

    def stored(self) -> list[tuple[str, str]]:
        """(namespace, id) of every session in the store."""
        return [(str(key[1]), str(key[2])) for key in self.store.keys("session")]

    def holds(self, namespace: str, session_id: str) -> bool:
        """Whether the session is kept (in memory, its write maybe on its way, or in the store), without reading it."""
        return self.recent.get((namespace, session_id)) is not None or self.store.contains(("session", namespace, session_id))

    def read(self, namespace: str, session_id: str) -> Session | None:
        """The session, for a look inside (the inspector, the CLI): read without joining the recent ones."""
        kept = self._load(namespace, session_id, remember=False)
        return kept.session if kept is not None else None

    def _load(self, namespace: str, session_id: str, remember: bool = True) -> Kept | None:
        """A session: in memory while it is still the store's, else read from the store (and, ``remember``, kept in memory)."""
        held = self.recent.get((namespace, session_id))
        if held is not None and self._valid(namespace, held):
            return Kept(held.session, held.version)
        kept = self._read(namespace, session_id)
        if kept is not None and remember:
            self._remember(namespace, _Held(*kept))
        return kept

    def _read(self, namespace: str, session_id: str) -> Kept | None:
        """The session as the store holds it now, with its version; None if it is not there whole.

        Its version and record are read together; a part that does not match
        the record was written since by another process: read again.
        """
        version_key, record_key = ("version", namespace, session_id), ("session", namespace, session_id)
        for _ in range(READS):
            version, raw = self.store.get_many([version_key, record_key])
            record = self.layout.record(record_key, raw)
            keys = self.layout.part_keys(namespace, record) if record is not None else None
            if record is None or keys is None:
                return None
            session = self.layout.assemble(record, keys, self.store.get_many(keys))
            if session is not None:
                return Kept(session, version.decode() if version else "")
            if self.store.get(version_key) == version:  # no write since: a part is gone for good
                return None
        return None

    def _valid(self, namespace: str, held: _Held) -> bool:
        """Whether a session kept in memory is still the store's: always, unless another process may write it."""
        if not self.shared or held.pending:
            return True
        stored = self.store.get(("version", namespace, held.session.id))
        return (stored.decode() if stored else "") == held.version

    def _find(self, namespace: str, chain: list[str]) -> tuple[Kept | None, int]:
        """The session holding the longest prefix of ``chain``, and that prefix's length."""
        extended = self._extended(namespace, chain)
        if extended is not None:
            return Kept(extended.session, extended.version), len(extended.session.chain)
        # Links reach the store in the background: a fork that comes right after
        # its parent must still find the parent's links.
        self.flush()
        for i in _probes(len(chain)):
            session_id = self.store.get(("link", namespace, chain[i]))
            if session_id is None:
                continue
            kept = self._load(namespace, session_id.decode())
            if kept is not None and i < len(kept.session.chain) and kept.session.chain[i] == chain[i]:
                return kept, common_prefix(kept.session.chain, chain)
        return None, 0

    def _by_transcript(self, namespace: str, conversation: Conversation, text: bytes) -> Resolution | None:
        """The session a follow-up continues, found in the store by the transcript digests of its history's last prefixes."""
        history = conversation.history
        probes = prefix_digests(text, history, LINK_STRIDE)
        for (n, _), value in zip(probes, self.store.get_many([(TRANSCRIPTS, namespace, d) for _, d in probes])):
            if value is None:
                continue
            session_id, _, last = value.decode().partition(" ")
            kept = self._load(namespace, session_id)
            if kept is None or len(kept.session.chain) < n or kept.session.chain[n - 1] != last:
                continue
            links, reused = links_continuing(kept.session, conversation.chained, len(history), n)
            return Resolution(found=kept.session, reused=reused, links=links, version=kept.version)
        return None

    def _extended(self, namespace: str, chain: list[str]) -> _Held | None:
        """The longest recent session that ``chain`` extends: a follow-up, found without the store."""
        recent = self.recent.of(namespace)
        session = longest_extended(chain, (held.session for held in recent.values()))
        best = recent[session.id] if session is not None else None
        return best if best is not None and self._valid(namespace, best) else None

    def _continued(self, namespace: str, text: bytes) -> _Held | None:
        """The longest recent session whose messages the transcript ``text`` opens with: a follow-up, found without its chain."""
        best = None
        for held, known in self.recent.transcribed(namespace):
            if (best is None or len(held.session.chain) > len(best.session.chain)) and begins_with(text, known):
                best = held
        if best is not None and not self._valid(namespace, best):
            self._settled(namespace, (best.session.id, best.version), None)  # another process has written it since
            return None
        return best

    def _settled(self, namespace: str, mine: tuple[str, str], kept: Kept | None) -> None:
        """A write is done: memory holds what the store kept in place of what ``save`` put there (unless a later save replaced that)."""
        self.recent.replace((namespace, mine[0]), mine[1], _Held(*kept) if kept is not None else None)

    def flush(self) -> None:
        """Wait for the writes submitted so far."""
        if self.pending is not None:
            try:
                self.pending.result()
            except Exception:
                pass  # the request that made it was told

    def _remember(self, namespace: str, held: _Held) -> None:
        """Keep a session in memory, where the next request finds it before it reaches the store."""
        self.recent.put((namespace, held.session.id), held)


def _probes(n: int) -> list[int]:
    """The positions of an ``n``-link chain a lookup tries, latest first."""
    below = max(n - LINK_STRIDE, 0)  # the tail starts here
    strided = range(below // LINK_STRIDE * LINK_STRIDE - 1, LINK_STRIDE - 1, -LINK_STRIDE)
    return [*range(n - 1, below - 1, -1), *strided, *range(min(below, LINK_STRIDE) - 1, -1, -1)]
