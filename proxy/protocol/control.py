"""Per-request and per-model control: which mode a chat completion is served in, under which ``Policy``.

The settings give the default policy (``app.policy_of``); ``[models."NAME"]``
tables change it for the models a name or glob matches; a request may then ask,
by header, for less than its model's policy allows, never for more:

* ``x-pcp-mode-request: auto | off | force`` — ``off`` forwards the request as it
  came even above the threshold; ``force`` pages it even below;
* ``x-pcp-threshold: N`` — protocol mode engages above ``N`` prompt tokens
  (at most the model's threshold);
* ``x-pcp-budget: N`` — the most tokens of paged context a worker call may
  carry on top of its head (512 up to the model's budget).

A request that sends none of these headers costs a few dictionary lookups
(``Controls.of``): passthrough stays as cheap as it was. The headers are the
proxy's and are not forwarded upstream.

Where the settings give no context window, the window of a well-known model
family (``KNOWN_WINDOWS``) is its model's: the Sentry can then forward a
conversation that fits it while paging would cost more. These are the smallest
windows each family's current models have, so a conversation the proxy lets
through fits the model it names.

Where the window is known, so are the threshold and the budget (``KNOWN_DEFAULTS``)
where the settings give none (0, their default) and no ``[models."…"]`` table
sets them: a coding agent's history is paged within
16,384 tokens on top of its head (``pcp_core.head_tokens``) from 32,768 tokens
on. The chat defaults stay where the family is a chat one (gpt-4o*): the cost
replay measures them there.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Literal

import msgspec

from pcp_core import Policy, with_cached_frame
from pcp_core.round_policy import MIN_BUDGET

from .. import headers as pcp
from ..errors import ClientError
from ..settings import ModelSettings, Settings

__all__ = ["CONTROL_HEADERS", "KNOWN_DEFAULTS", "Control", "Controls", "Mode", "known_defaults", "known_window", "tuned"]

Mode = Literal["auto", "off", "force"]
MODES: tuple[Mode, ...] = ("auto", "off", "force")
MODE, THRESHOLD, BUDGET = pcp.MODE_REQUEST, pcp.THRESHOLD, pcp.BUDGET
CONTROL_HEADERS = (MODE, THRESHOLD, BUDGET)
# Model names are the client's to choose: the memo of their policies is bounded.
KNOWN_MODELS = 256
# Context windows of well-known model families, by glob (first match): what the Sentry knows without settings.
KNOWN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("claude-*", 200_000),
    ("gpt-4o*", 128_000),
    ("gpt-4.1*", 1_000_000),
    ("gpt-5*", 272_000),  # the input a request may carry, of 400k with the output
    ("o3*", 200_000),
    ("o4-mini*", 200_000),
)


# A known family's threshold and budget, by glob (first match; none: the settings'), where the settings keep the built-in ones.
# A 200k-token model reads an agent's head (~20k tokens of system prompt and tools for Claude Code) and 16k of pages well
# inside its window, a tenth of what the agent compacts at; paging engages from 32k, and pays (cached input at 0.1) once
# the history is ~2.35x the budget, ~38k tokens: long before any agent's own compaction (~80-90% of the window).
AGENT_THRESHOLD, AGENT_BUDGET = 32_768, 16_384
KNOWN_DEFAULTS: tuple[tuple[str, int, int], ...] = (
    ("claude-*", AGENT_THRESHOLD, AGENT_BUDGET),
    ("gpt-4.1*", AGENT_THRESHOLD, AGENT_BUDGET),
    ("gpt-5*", AGENT_THRESHOLD, AGENT_BUDGET),
    ("o3*", AGENT_THRESHOLD, AGENT_BUDGET),
    ("o4-mini*", AGENT_THRESHOLD, AGENT_BUDGET),
)


class Control(msgspec.Struct, frozen=True):
    """How one request is served: ``mode`` (auto: the Sentry decides), under ``policy``."""

    mode: Mode
    policy: Policy
    requested: bool = False  # the request's headers changed it


class Controls:
    """The control of each request: its model's policy, narrowed by the request's headers."""

    def __init__(self, settings: Settings, default: Policy):
        # A family's threshold and budget apply where the settings give none of their own (0); never on the embedded
        # model (no upstream), whose slot and budget are its own whatever model a client names.
        embedded = not settings.upstream_base_url
        self.tuned = embedded or bool(settings.sentry_threshold), embedded or bool(settings.context_budget)
        self.default = Control("auto", _cached_frame(default, self.tuned[1]))
        models = settings.models
        self.exact = {name: spec for name, spec in models.items() if not _is_glob(name)}
        self.globs = [(name, spec) for name, spec in models.items() if _is_glob(name)]
        self.by_model: dict[str, Control] = {}
        # Windows the upstream named in refusing a prompt as too long (``protocol.refusals``): smaller than known ones.
        self.learned: dict[str, int] = {}

    def of(self, headers: dict[str, str], model: str | None) -> Control:
        """The control of a request with these (forwardable, lower-case) ``headers``, which lose the control headers."""
        base = self.for_model(model) if model is not None else self.default
        if MODE not in headers and THRESHOLD not in headers and BUDGET not in headers:
            return base
        return _requested(base, headers.pop(MODE, None), headers.pop(THRESHOLD, None), headers.pop(BUDGET, None))

    def for_model(self, model: str) -> Control:
        """The policy the settings give ``model``: an exact ``[models."NAME"]`` first, else the first glob that matches."""
        known = self.by_model.get(model)
        if known is not None:
            return known
        spec = self.exact.get(model) or next((spec for pattern, spec in self.globs if fnmatchcase(model, pattern)), None)
        policy = self.default.policy if spec is None else tuned(self.default.policy, spec)
        if not policy.window and (spec is None or spec.context_window is None):  # a model entry's 0 says: unknown
            policy = msgspec.structs.replace(policy, window=known_window(model))
        learned = self.learned.get(model)
        if learned and (not policy.window or learned < policy.window):
            policy = msgspec.structs.replace(policy, window=learned)
        budget_set = self.tuned[1] or (spec is not None and spec.context_budget is not None)
        policy = _family(policy, model, (self.tuned[0] or (spec is not None and spec.sentry_threshold is not None), budget_set))
        policy = _cached_frame(policy, budget_set or known_defaults(model) is not None)
        control = self.default if policy == self.default.policy else Control("auto", policy)
        if len(self.by_model) >= KNOWN_MODELS:
            self.by_model.clear()
        self.by_model[model] = control
        return control

    def learn(self, model: str, window: int) -> None:
        """``model``'s window as the upstream named it in a refusal: its requests are fitted to it from now on."""
        if len(self.learned) >= KNOWN_MODELS:
            self.learned.clear()
        self.learned[model] = window
        self.by_model.pop(model, None)


def known_window(model: str) -> int:
    """The context window of ``model``'s family if it is a well-known one, else 0 (unknown)."""
    return next((window for pattern, window in KNOWN_WINDOWS if fnmatchcase(model, pattern)), 0)


def known_defaults(model: str) -> tuple[int, int] | None:
    """The threshold and budget of ``model``'s family where it is a known one with its own (``KNOWN_DEFAULTS``), else None."""
    return next(((threshold, budget) for pattern, threshold, budget in KNOWN_DEFAULTS if fnmatchcase(model, pattern)), None)


def _family(policy: Policy, model: str, tuned: tuple[bool, bool]) -> Policy:
    """``policy`` with the threshold and budget of ``model``'s family, when it has its own, where the settings (``tuned``) give none."""
    known = known_defaults(model)
    if known is None:
        return policy
    threshold = policy.threshold if tuned[0] else known[0]
    budget = policy.rounds.budget if tuned[1] else known[1]
    return msgspec.structs.replace(policy.with_rounds(budget=budget), threshold=threshold)


def _cached_frame(policy: Policy, budget_given: bool) -> Policy:
    """``policy`` with a follow-up's frame carried on top of the chat budget (``pcp_core.with_cached_frame``); none on
    a budget given by a user or a model family's defaults (a coding agent's, sized for long tool output): it stays the cap."""
    if not budget_given:
        return with_cached_frame(policy)
    return policy.with_rounds(cached_budget=0) if policy.rounds.cached_budget else policy


def _is_glob(name: str) -> bool:
    """Whether a ``[models."…"]`` name is a glob."""
    return any(c in name for c in "*?[")


# Where each setting that tunes the policy goes in it: the round policy's field of the same name, or the Sentry's.
ROUNDS_TUNED = ("max_rounds", "cached_input_price", "followup_share", "followup_rounds")
RENAMED = {"context_budget": "budget"}  # in the round policy
SENTRY_TUNED = {"sentry_threshold": "threshold", "context_window": "window"}  # in the policy


def tuned(policy: Policy, values: ModelSettings) -> Policy:
    """``policy`` with the values a ``[models."…"]`` table (or the settings, ``services.policy_of``) gives; None keeps its own."""
    given = {name: value for name in ModelSettings.__struct_fields__ if (value := getattr(values, name)) is not None}
    rounds = {RENAMED.get(name, name): value for name, value in given.items() if name in ROUNDS_TUNED or name in RENAMED}
    sentry = {SENTRY_TUNED[name]: value for name, value in given.items() if name in SENTRY_TUNED}
    return msgspec.structs.replace(policy.with_rounds(**rounds), **sentry)


def _requested(base: Control, mode: str | None, threshold: str | None, budget: str | None) -> Control:
    """``base`` as the request's headers narrow it; a value that is not one is a 400 that names its header."""
    policy = base.policy
    if mode is not None:
        mode = mode.strip().lower()
        if mode not in MODES:
            raise ClientError(f"{MODE} must be auto, off or force, not {mode[:40]!r}", param=MODE, code="invalid_header")
    if threshold is not None:
        # At most the model's threshold: a client may page sooner, not later (that is what "off" says).
        policy = msgspec.structs.replace(policy, threshold=min(_tokens(THRESHOLD, threshold, 1), policy.threshold))
    if budget is not None:  # the client's budget is the cap: no frame on top of it
        policy = policy.with_rounds(budget=min(_tokens(BUDGET, budget, MIN_BUDGET), policy.rounds.budget), cached_budget=0)
    return Control(mode or base.mode, policy, requested=True)


def _tokens(header: str, value: str, least: int) -> int:
    """A header's whole number of tokens, at least ``least`` (more than 12 digits: 10**12), or the 400 that names it."""
    text = value.strip()
    # Past 12 digits it is more than any model reads: the maximum applies (and int() of
    # thousands of digits is refused by Python, or slow).
    number = (int(text) if len(text) <= 12 else 10**12) if text.isascii() and text.isdigit() else -1
    if number < least:
        raise ClientError(f"{header} must be a whole number of tokens, at least {least:,}, not {value[:40]!r}", param=header, code="invalid_header")
    return number
