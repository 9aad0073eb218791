"""A conversation edited, cut back, pinned, pasted into and carried across restarts never shows the worker
a word of a message the request does not hold.

A stateful property test (hypothesis) against the real proxy in protocol
mode: every message carries words of its own ("zq" and six letters), and
after each step the worker prompt may show only words the request sent.
Sessions are reused, forked and rebuilt underneath; a page of a message
edited away that leaked into a later prompt would show here.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from proxy.settings import Settings
from proxy.testing.upstream import FakeUpstream, completion
from tests.proxy.helpers import ask

from .conftest import RunningProxy

WORD = re.compile(r"zq[a-z]{6}")


class Conversation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.upstream = FakeUpstream(default=lambda recorded: completion("ok"))
        self.data_dir = tempfile.TemporaryDirectory(prefix="pcp-forks-")
        self.proxy = self._serve()

    def _serve(self) -> RunningProxy:
        fields = {
            "upstream_base_url": self.upstream.url,
            "data_dir": self.data_dir.name,
            "router_embeddings": False,
            "sentry_threshold": 300,
            "context_budget": 2048,
            "max_rounds": 1,
            "block_tokens": 400,
        }
        return RunningProxy(Settings(**fields), self.upstream)

    def teardown(self) -> None:
        self.proxy.stop()
        self.data_dir.cleanup()

    def word(self) -> str:
        return "zq" + "".join(self.random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))

    @initialize(seed=st.integers(0, 2**32))
    def begin(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.pinned: str | None = None
        self.messages = [{"role": "system", "content": "Be brief."}]
        for i in range(30):
            self.messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {self.word()} about gardens {self.word()} and rivers"})

    def asked(self) -> None:
        """The conversation asked a new question: the worker is shown no word the request does not hold."""
        self.upstream.requests.clear()
        messages = [*self.messages, {"role": "user", "content": f"What about {self.word()}?"}]
        ask(self.proxy, messages, "k", headers={"x-pcp-session": self.pinned} if self.pinned else {})
        sent = set(WORD.findall(json.dumps(messages)))
        for recorded in self.upstream.chat_requests("worker"):
            shown = set(WORD.findall(recorded.json["messages"][0]["content"]))
            assert shown <= sent, f"the worker was shown words no message of the request holds: {sorted(shown - sent)[:5]}"
        self.messages += [messages[-1], {"role": "assistant", "content": f"Answer {self.word()}."}]

    @rule(n=st.integers(1, 6))
    def follow_up(self, n: int) -> None:
        self.messages += [{"role": "user", "content": f"more {self.word()} {self.word()}"} for _ in range(n - 1)]
        self.asked()

    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(1, len(self.messages) - 1))
        self.messages[i] = {"role": self.messages[i]["role"], "content": f"edited {self.word()} {self.word()}"}
        self.asked()

    @rule(data=st.data())
    def cut_back(self, data: st.DataObject) -> None:
        self.messages = self.messages[: data.draw(st.integers(10, len(self.messages)))]
        self.asked()

    @rule()
    def paste_a_file(self) -> None:
        lines = "\n".join(f"line {self.word()} of the notes, with more words to fill it" for _ in range(120))
        self.messages.append({"role": "user", "content": f"# Notes\n\n{lines}"})
        self.asked()

    @rule(session=st.sampled_from([None, "p-1", "p-2"]))
    def pin(self, session: str | None) -> None:
        self.pinned = session
        self.asked()

    @rule()
    def restart(self) -> None:
        self.proxy.stop()
        self.proxy = self._serve()
        self.asked()


# The same examples in every run; FUZZ_EXAMPLES=200 searches further, with new ones each time.
SEARCH = os.environ.get("FUZZ_EXAMPLES")
Conversation.TestCase.settings = settings(
    max_examples=int(SEARCH or 12), stateful_step_count=10, derandomize=SEARCH is None, deadline=None, suppress_health_check=list(HealthCheck)
)
TestForks = Conversation.TestCase
