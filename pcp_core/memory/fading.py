"""Memory's metabolism (P-Mem §3.2, fade): what a scope's pages were used for, and how far each has faded, as rules.

A scope counts the requests it served (its clock). Each page keeps how many
it was given to, shown in, and opened by a Consult, and the clock when it
was written or last consulted. Where the Memory Router ranks (``selection``):

* **fade by age** — a page loses weight as its timestamp ages (half-life
  ``half_life_days``), more slowly the more requests it was given to;
* **decay by disuse** — a page no Consult opened over many of the scope's
  requests loses weight (half-life ``half_life_requests``), whether it was
  never shown or shown and passed over: what keeps being offered and never
  opened sinks, and so does what nothing asks for;
* **rise by use** — each Consult that opens it lifts a page, and restarts
  its clock.

Together they move a page by at most ``fade_weight`` and ``rise_weight``
standard deviations of the candidates' scores: enough to order pages that
match alike, never to bury the page a question names.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ..effects import Outcome
from ..pages.index import Activation
from ..pages.logical import Page

__all__ = ["MemoryUse", "Metabolism", "decay", "fade", "memory_use", "rise", "vitality"]


class Metabolism(msgspec.Struct, frozen=True):
    half_life_days: float = 365.0  # fade by age, stretched by each request a page was given to
    half_life_requests: int = 1000  # decay by disuse: the scope's requests since a page was written or last consulted
    fade_weight: float = 0.25  # standard deviations a fully faded page loses
    rise_weight: float = 0.25  # standard deviations a page many Consults opened gains


class MemoryUse(msgspec.Struct, frozen=True):
    """What a request did with its scope's pages: given to it, shown in its prompts (in full or by summary), opened by a Consult."""

    given: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()
    consulted: tuple[str, ...] = ()


def memory_use(given: Iterable[Page], outcome: Outcome | None) -> MemoryUse:
    """A request's use of memory: the pages the Memory Router gave it, and what its rounds showed and opened.

    The ids of the history's pages are in the outcome too; the host matches
    only its scope's ids (a memory id is longer than a history id).
    """
    ids = tuple(dict.fromkeys(page.id for page in given))
    if outcome is None:
        return MemoryUse(given=ids)
    shown = tuple(pid for pid, state in outcome.pages.items() if state.activation in (Activation.HOT, Activation.INDEXED))
    consulted = tuple(dict.fromkeys(step.target for step in outcome.trace if step.action == "Consult"))
    return MemoryUse(given=ids, shown=shown, consulted=consulted)


def fade(age_days: float, recalls: int, policy: Metabolism = Metabolism()) -> float:
    """How far a page has faded by age, 0 (fresh) to 1: half way after a half-life, stretched by each recall."""
    if not age_days > 0:
        return 0.0
    return 1.0 - 0.5 ** (age_days / (policy.half_life_days * (1 + recalls)))


def decay(idle: int, policy: Metabolism = Metabolism()) -> float:
    """How far a page has decayed by disuse, 0 to 1: half way after ``half_life_requests`` of its scope's requests without a Consult."""
    if idle <= 0 or policy.half_life_requests <= 0:
        return 0.0
    return 1.0 - 0.5 ** (idle / policy.half_life_requests)


def rise(consulted: int) -> float:
    """How far Consults have lifted a page, 0 to 1: half way with the first."""
    return 1.0 - 0.5 ** max(consulted, 0)


def vitality(age_days: float, recalls: int, idle: int, consulted: int, policy: Metabolism = Metabolism()) -> float:
    """A page's standing from its use, in standard deviations: what Consults lifted less what age and disuse faded."""
    faded = 1.0 - (1.0 - fade(age_days, recalls, policy)) * (1.0 - decay(idle, policy))
    return policy.rise_weight * rise(consulted) - policy.fade_weight * faded
