"""PACT components on sessions: where the host keeps them, and where a request meets them.

A session's components are one ``pcp_core.Tree``, kept in
``PCP_DATA_DIR/components`` (diskcache) under the caller's namespace and the
session's id, beside the sessions; the recent ones stay decoded in memory.
Every tree on disk is known by its key from the start, so a request learns
that its session has none from a set, without reading the disk.

A request meets its session's components in one of two places:

* below the threshold (``passthrough``), only when it names its session in
  ``x-pcp-session`` or carries components inline (``pcp_components``): a
  request that does neither is forwarded as it came, with no lookup and no
  copy; one whose session has no live component to render, byte for byte;
* in protocol mode (``attach``), the session the store resolved (pinned or
  recognised) is the one whose components it renders; a fork starts from
  its parent's and leaves the parent's as they were.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from pcp_core import (
    ComponentSpec,
    Conversation,
    PactError,
    Prepared,
    Resolution,
    Tree,
    chain_links,
    conversation_links,
    on_request,
    onto_messages,
    placement,
    with_components,
)
from pcp_core.conversation import conversation_start
from pcp_core.pact.tree import MAX_COMPONENTS

from .. import headers as pcp
from ..apis.codec import Reading
from ..errors import ClientError
from ..own_api import too_large
from ..storage.base import Store
from ..storage.keyed_store import RECENT, KeyedStore, store_key
from ..storage.sealing import Sealer

__all__ = ["ComponentStore", "Components"]

SEEN = 64  # sessions without components whose last conversation is remembered


class ComponentStore(KeyedStore[Tree]):
    """Trees by (namespace, session id): in memory, and on disk written by one background thread, in order."""

    def __init__(self, store: Store | Path, sealer: Sealer | None = None, recent: int = RECENT):
        """Sessions' component trees kept in ``store``, the most recent in memory."""
        super().__init__(store, Tree, "the components of a session", sealer, recent)
        # The last conversation of each recent session that has no components yet, as a function giving its
        # hash chain (computed only if asked): a component the API attaches to it then knows which message d0 is.
        self.seen: OrderedDict[str, Callable[[], list[str]]] = OrderedDict()

    def saw(self, namespace: str, session_id: str, links: Callable[[], list[str]]) -> None:
        """Remember the conversation of a request of a session without components (memory only, the ``SEEN`` latest)."""
        key = store_key(namespace, session_id)
        with self.lock:
            self.seen[key] = links
            self.seen.move_to_end(key)
            if len(self.seen) > SEEN:
                self.seen.popitem(last=False)

    def named_lately(self, namespace: str, session_id: str) -> bool:
        """Whether a recent request named the session, which has no components yet (``saw``)."""
        with self.lock:
            return store_key(namespace, session_id) in self.seen

    def change(self, namespace: str, session_id: str, step: Callable[[Tree], Tree], base: str | None = None) -> Tree:
        """Keep ``step(tree)`` as the session's tree, and return it.

        ``tree`` is ``base``'s when given (a fork's parent), else the session's
        own; a new one is placed in the conversation the session was last seen
        with (``saw``), if it is remembered.
        """
        key = store_key(namespace, session_id)
        outcome: list[Tree] = []

        def kept(held: Tree | None) -> Tree | None:
            """The tree ``step`` makes of what is kept, or None where nothing changes."""
            tree = self._get(store_key(namespace, base)) if base is not None else held
            if tree is None:
                links = self.seen.get(key)
                tree = Tree(count=len(chain), chain=chain) if links is not None and (chain := links()) is not None else Tree()
            outcome[:] = [step(tree)]  # may refuse (a ClientError): then nothing is kept, nor forgotten
            return None if outcome[0] is tree else outcome[0]

        with self.lock:
            if self._change(key, kept)[1] is not None:
                self.seen.pop(key, None)
        return outcome[0]


class Components:
    """The two places a request meets its session's components."""

    def __init__(self, store: Store | Path, sealer: Sealer | None = None, max_bytes: int = 32 * 2**10, most: int = MAX_COMPONENTS):
        """Components kept in ``store``, each at most ``max_bytes``, at most ``most`` a session."""
        self.store = ComponentStore(store, sealer)
        # A session's components are rendered into each of its prompts, and its tree is encoded whole at each change.
        self.max_bytes, self.most = max_bytes, most

    def check_size(self, spec: ComponentSpec, where: str = "the component") -> None:
        """The 413 for a component whose content is over ``component_max_kb``."""
        size = len(spec.content.encode(errors="surrogatepass"))
        if size > self.max_bytes:
            raise too_large(f"{where}'s content", f"{size} bytes", f"{self.max_bytes} bytes", "component_max_kb")

    async def passthrough(
        self, headers: Mapping[str, str], namespace_of: Callable[[], str], request: Reading, body: bytes, pcp_headers: dict[str, str]
    ) -> bytes:
        """The body to forward below the threshold: with the session's live components in place.

        As it came, without a lookup, when the request neither names a session
        nor carries components; byte for byte when there is nothing to render.
        ``pcp_headers`` gains ``x-pcp-components`` when the session has components.
        """
        if request.components is None and pcp.SESSION not in headers:
            return body

        pinned = pcp.pinned_session(headers)
        namespace = namespace_of()  # a keyed hash: only for a request that may have components
        messages = request.messages
        if request.components is None and (pinned is None or not self.store.holds(namespace, pinned)):
            if pinned is not None:
                self.store.saw(namespace, pinned, lambda: chain_links(messages[conversation_start(messages) :]))
            return body
        links = chain_links(messages[conversation_start(messages) :])
        step = self._step(links, request.components or [])
        if pinned is None:  # no session to keep them in: they render in this request alone
            tree = step(Tree())
        elif self.store.in_memory(namespace, pinned):
            tree = self.store.change(namespace, pinned, step)
        else:
            tree = await asyncio.to_thread(self.store.change, namespace, pinned, step)
        placed = placement(tree)
        pcp_headers[pcp.COMPONENTS] = str(placed.count)
        if not placed.count and request.components is None:
            return body
        fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])  # the fields the proxy does not read stay as they came
        fields.pop("pcp_components", None)
        return msgspec.json.encode({**fields, "messages": onto_messages(request.messages, placed)})

    def attach(self, namespace: str, conversation: Conversation, resolution: Resolution, prepared: Prepared, inline: Sequence[Any] | None) -> Prepared:
        """``prepared`` with its session's live components where they render, the session's tree advanced to this request.

        Blocking (the store may read the disk): called where the request is prepared, in a thread.
        """
        source = resolution.pinned or (resolution.found.id if resolution.found is not None else None)
        links = conversation_links(conversation, resolution.links)  # the chain's links and one hash: its messages are not kept
        if not inline and (source is None or not self.store.holds(namespace, source)):
            self.store.saw(namespace, prepared.session.id, lambda: links)
            return prepared
        specs = msgspec.convert(inline, list[ComponentSpec]) if inline else []  # checked when the request was read
        tree = self.store.change(namespace, prepared.session.id, self._step(links, specs), base=source)
        return with_components(prepared, conversation, tree)

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def _step(self, links: list[str], inline: Sequence[ComponentSpec]) -> Callable[[Tree], Tree]:
        """The change one request makes to its session's tree; a component it carries that the rules refuse is the client's 400
        (one over a limit, a 413)."""
        for i, spec in enumerate(inline):
            self.check_size(spec, f"pcp_components[{i}]")

        def step(tree: Tree) -> Tree:
            """The tree as the request's components change it, within the session's bound."""
            try:
                changed = on_request(tree, links, inline, time.time_ns())
            except PactError as error:
                raise ClientError(str(error), param=error.param, code="invalid_component") from None
            if len(changed.components) > self.most and len(changed.components) > len(tree.components):
                raise too_large("this session's components", str(len(changed.components)), str(self.most), "components_per_session")
            return changed

        return step
