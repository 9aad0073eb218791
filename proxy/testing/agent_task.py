"""A coding agent's task for a scripted upstream: a throwaway git repo with a bug, and the script that fixes it.

The repo (``make_repo``) is a tiny Python package ``calc`` whose ``add_totals``
subtracts, with two unittest tests, one failing. The script drives an agent
through five steps, each carried out with the agent's own tools:

1. read ``calc/ops.py`` (its read tool, or ``cat`` in its shell);
2. run ``grep -rn "def " calc`` (``big``: and print 24 kB of ``docs/NOTES.md``,
   ~6k tokens, so that the history grows past a proxy's threshold);
3. edit ``return first - second`` into ``+`` (Claude Code's ``Edit``, Codex's
   ``apply_patch``, opencode's ``edit``; aider a SEARCH/REPLACE block);
4. run the tests;
5. answer in text: ``TASK-DONE: …``.

Each step is decided from the text the request carries, never from a count of
the requests seen: the latest stage whose evidence is there wins (the tests'
``OK``, the edit, the grep's output, the file's ``CALC-17`` docstring). Behind a
proxy that rewrites the prompt into a ``<PagedContext>`` it finds its step the
same way, as long as the latest tool result reaches it. A directive is never
called: the worker answers in its first round.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

__all__ = [
    "TASK_PROMPT",
    "TEST_CMD",
    "Step",
    "check_repo",
    "conversation_text",
    "decide",
    "evidence",
    "find_cwd",
    "flavor",
    "make_repo",
    "side_reply",
    "aider_reply",
    "tool_call",
    "tool_defs",
]

OPS_PY = '''"""calc.ops: arithmetic helpers (ticket CALC-17)."""


def add_totals(first, second):
    """Return the sum of two totals."""
    return first - second


def scale(value, factor):
    """Return value multiplied by factor."""
    return value * factor
'''

TEST_PY = """import unittest

from calc.ops import add_totals, scale


class OpsTest(unittest.TestCase):
    def test_add_totals(self):
        self.assertEqual(add_totals(2, 3), 5)

    def test_scale(self):
        self.assertEqual(scale(4, 3), 12)


if __name__ == "__main__":
    unittest.main()
"""

BUG_LINE = "    return first - second"
FIX_LINE = "    return first + second"
TARGET = "calc/ops.py"
NOTES = "docs/NOTES.md"
TEST_CMD = "python3 -m unittest discover -s tests -v"
GREP_CMD = 'grep -rn "def " calc'
NOTES_BYTES = 24000  # ~6k tokens: under every agent's own cap on a command's output (Claude Code's is ~30 kB)
TASK_PROMPT = (
    "The unit tests in tests/test_ops.py fail. Find and fix the bug in the calc package, then run the tests with `python3 -m unittest discover -s tests -v`."
)
GIT_ENV = {"GIT_AUTHOR_NAME": "task", "GIT_AUTHOR_EMAIL": "task@example.invalid", "GIT_COMMITTER_NAME": "task", "GIT_COMMITTER_EMAIL": "task@example.invalid"}


def notes_text(paragraphs: int = 160, first: int = 0, title: str = "# Notes on the calc package") -> str:
    """A long Markdown file of varied notes (~75 tokens a paragraph), numbered from ``first`` + 1: what a ``big`` step prints."""
    words = ("ledger", "invoice", "rounding", "currency", "batch", "reconcile", "audit", "quarter", "refund", "settlement", "merchant", "payout", "tax")
    out = [title, ""]
    for i in range(first, first + paragraphs):
        if i % 10 == 0:
            out += [f"## Section {i // 10 + 1}", ""]
        w = [words[(i * 7 + k * 3) % len(words)] for k in range(10)]
        out += [
            f"Note {i + 1}: the {w[0]} step follows the {w[1]} run of day {i % 28 + 1}; {w[2]} totals go to the {w[3]} table, "
            f"{w[4]} by {w[5]}, then {w[6]} and {w[7]} entries are checked against {w[8]} reference {1000 + i * 37} before the {w[9]} closes.",
            "",
        ]
    return "\n".join(out)


# A longer task's notes come in parts, each printed by a step of its own (~1.8k tokens: a page a small window shows whole).
PART_PARAGRAPHS = 36


def part_path(k: int) -> str:
    """The path of the notes' part ``k``."""
    return f"docs/NOTES-{k}.md"


def part_marker(k: int, parts: int) -> str:
    """What the first line of the notes' part ``k`` says, by which the script knows it was printed."""
    return f"NOTES-PART-{k}-OF-{parts}"


def notes_part(k: int, parts: int) -> str:
    """The text of the notes' part ``k`` of ``parts``."""
    return notes_text(PART_PARAGRAPHS, (k - 1) * PART_PARAGRAPHS, f"# Notes on the calc package ({part_marker(k, parts)})")


def make_repo(path: str, parts: int = 0) -> None:
    """The task's git repo at ``path``: the bug committed, the tests failing; with ``parts`` notes files for a longer task."""
    files = {
        **{part_path(k): notes_part(k, parts) for k in range(1, parts + 1)},
        "calc/__init__.py": "",
        TARGET: OPS_PY,
        "tests/__init__.py": "",
        "tests/test_ops.py": TEST_PY,
        NOTES: notes_text(),
        "README.md": f"# calc\n\nSmall arithmetic helpers. Run the tests with `{TEST_CMD}`.\n",
    }
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        with open(os.path.join(path, rel), "w") as f:
            f.write(text)
    env = {**os.environ, **GIT_ENV}
    for command in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "calc with a bug"]):
        subprocess.run(command, cwd=path, check=True, env=env)


def check_repo(path: str) -> dict[str, Any]:
    """The task's outcome in the repo: the line fixed, the tests run and passing."""
    with open(os.path.join(path, TARGET)) as f:
        text = f.read()
    run = subprocess.run(TEST_CMD.split(), cwd=path, capture_output=True, text=True, timeout=60)
    return {"fixed": FIX_LINE in text and BUG_LINE not in text, "tests_pass": run.returncode == 0, "test_output": run.stderr[-400:]}


# -- reading a request ---------------------------------------------------------------------


def _strings(node: Any, out: list[str]) -> None:
    """Every string in a JSON value, in order, added to ``out``."""
    if isinstance(node, str):
        out.append(node)
    elif isinstance(node, list):
        for x in node:
            _strings(x, out)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key not in ("tools", "tool_choice", "model", "metadata"):
                _strings(value, out)


def conversation_text(body: dict[str, Any]) -> str:
    """Every string of a request but its tool definitions: system, messages, tool calls and results."""
    out: list[str] = []
    _strings(body, out)
    return "\n".join(out)


def tool_defs(api: str, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The request's tools: name -> {"kind": function | custom, "schema": its JSON schema or None}."""
    out: dict[str, dict[str, Any]] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if api == "chat" and isinstance(tool.get("function"), dict) and tool["function"].get("name"):
            out[tool["function"]["name"]] = {"kind": "function", "schema": tool["function"].get("parameters")}
        elif api == "responses" and tool.get("type") in ("function", "custom") and tool.get("name"):
            out[tool["name"]] = {"kind": tool["type"], "schema": tool.get("parameters")}
        elif api == "messages" and tool.get("name"):
            out[tool["name"]] = {"kind": "function", "schema": tool.get("input_schema")}
    return out


DIRECTIVES = frozenset({"consult", "explore", "shelve"})  # the proxy's own tools, never called here


def flavor(tools: dict[str, Any], text: str) -> str:
    """Which agent asks: "claude", "codex", "opencode", "aider" (no tools, SEARCH/REPLACE), "notools" (a side request), "generic"."""
    names = {name for name in tools if name.lower() not in DIRECTIVES}
    if {"Bash", "Read", "Edit"} <= names:
        return "claude"
    if "apply_patch" in names or names & {"shell", "exec_command", "shell_command"}:
        return "codex"
    if {"bash", "read", "edit"} <= names:
        return "opencode"
    if not names:
        if re.search(r"commit message", text[:3000], re.I):
            return "notools"
        return "aider" if "SEARCH/REPLACE" in text or "<<<<<<< SEARCH" in text else "notools"
    return "generic"


_CWD = [
    r"<cwd>([^<\n]+)</cwd>",  # Codex's environment_context
    r"Primary working directory:\s*(/[^\s<]+)",  # Claude Code
    r"[Ww]orking directory:\s*(/[^\s<]+)",  # Claude Code, opencode
]


def find_cwd(text: str) -> str | None:
    """The agent's working directory, as its prompt states it (tools that need absolute paths)."""
    for pattern in _CWD:
        m = re.search(pattern, text)
        if m:
            return m.group(1).strip().rstrip(".,;:")
    return None


# -- the script ----------------------------------------------------------------------------

TESTS_OK = re.compile(r"Ran \d+ tests? in [\d.]+s\s+OK")
TESTS_FAILED = re.compile(r"FAILED \((?:failures|errors)=\d+")
GREP_SEEN = re.compile(r"ops\.py:\d+:\s*def add_totals")
READ_SEEN = "CALC-17"
Step = dict[str, Any]


def evidence(text: str, parts: int = 0) -> tuple[str, ...]:
    """Which steps' output ``text`` shows: what a request (or the proxy's prompt for it) still holds of the task."""
    seen = {"read": READ_SEEN in text, "grep": bool(GREP_SEEN.search(text)), "edit": "first + second" in text, "tests": bool(TESTS_OK.search(text))}
    notes = tuple(f"notes-{k}" for k in range(1, parts + 1) if part_marker(k, parts) in text)
    return (*(name for name, shown in seen.items() if shown), *notes)


def decide(text: str, big: bool, parts: int = 0) -> Step:
    """The next step for a conversation whose text is ``text``: its latest evidence first. With ``parts``, a longer
    task: the grep prints the notes' first part, and a step of its own each of the others, before the edit."""
    if TESTS_OK.search(text):
        return {"step": "answer", "text": "TASK-DONE: add_totals subtracted its arguments; it now adds them, and both tests pass."}
    if TESTS_FAILED.search(text) and "first + second" in text:
        return {"step": "answer", "text": "TASK-FAILED: the tests still fail after the edit."}
    if "first + second" in text:
        return {"step": "test", "cmd": TEST_CMD}
    shown = next((k for k in range(parts, 0, -1) if part_marker(k, parts) in text), 0)
    if shown and shown < parts:
        return {"step": "notes", "cmd": f"cat {part_path(shown + 1)}"}
    if GREP_SEEN.search(text) or shown:
        return {"step": "edit"}
    if READ_SEEN in text:
        shows = f" && cat {part_path(1)}" if parts else f" && head -c {NOTES_BYTES} {NOTES}" if big else ""
        return {"step": "grep", "cmd": GREP_CMD + shows}
    return {"step": "read"}


PATCH = (
    "*** Begin Patch\n"
    f"*** Update File: {TARGET}\n"
    "@@ def add_totals(first, second):\n"
    '     """Return the sum of two totals."""\n'
    f"-{BUG_LINE}\n"
    f"+{FIX_LINE}\n"
    "*** End Patch\n"
)


def _props(schema: Any) -> dict[str, Any]:
    """A JSON schema's properties (none where it has none)."""
    return (schema.get("properties") or {}) if isinstance(schema, dict) else {}


def _shell_call(tools: dict[str, Any], cmd: str, cwd: str | None) -> tuple[str, Any] | None:
    """A call of the agent's shell tool that runs ``cmd``, in the tool's own argument shape."""
    for name in ("Bash", "bash", "shell_command", "exec_command", "shell"):
        if name not in tools:
            continue
        props = _props(tools[name]["schema"])
        key = "command" if "command" in props else "cmd" if "cmd" in props else "command"
        args: dict[str, Any] = {key: ["bash", "-lc", cmd] if (props.get(key) or {}).get("type") == "array" else cmd}
        if "description" in props:
            args["description"] = "Run: " + cmd[:60]
        if cwd and "workdir" in props:
            args["workdir"] = cwd
        return name, args
    return None


def _path(cwd: str | None, rel: str) -> str:
    """``rel`` below ``cwd``, where there is one."""
    return os.path.join(cwd, rel) if cwd else rel


def tool_call(step: Step, tools: dict[str, Any], cwd: str | None) -> tuple[str, Any] | None:
    """The call that carries out ``step`` with the agent's own tools: (name, arguments: an object,
    or the text of a custom tool's input); None when it has no tool for it."""
    kind = step["step"]
    if kind == "read":
        for name in ("Read", "read", "read_file"):
            if name in tools:
                props = _props(tools[name]["schema"])
                return name, {next((k for k in ("file_path", "filePath", "path") if k in props), "file_path"): _path(cwd, TARGET)}
        return _shell_call(tools, f"cat {TARGET}", cwd)
    if kind in ("grep", "notes", "test"):
        return _shell_call(tools, step["cmd"], cwd)
    if kind != "edit":
        return None
    for name in ("Edit", "edit"):
        props = _props(tools.get(name, {}).get("schema"))
        if "old_string" in props:
            return name, {"file_path": _path(cwd, TARGET), "old_string": BUG_LINE, "new_string": FIX_LINE}
        if "oldString" in props:
            return name, {"filePath": _path(cwd, TARGET), "oldString": BUG_LINE, "newString": FIX_LINE}
    if "apply_patch" in tools:
        patch = tools["apply_patch"]
        return ("apply_patch", PATCH) if patch["kind"] == "custom" else ("apply_patch", {next(iter(_props(patch["schema"])), "input"): PATCH})
    return _shell_call(tools, f"apply_patch <<'EOF'\n{PATCH}EOF", cwd)  # Codex without the tool takes a patch in its shell


def aider_reply(text: str, big: bool, parts: int = 0) -> str:
    """aider has no tools: it adds the files an answer names (the "read") and applies SEARCH/REPLACE blocks."""
    if TESTS_OK.search(text):
        return "TASK-DONE: add_totals now adds its arguments and the tests pass."
    if "first + second" in text and TESTS_FAILED.search(text):
        return "TASK-FAILED: the tests still fail after the edit."
    if READ_SEEN in text:
        return f"The bug is in `add_totals`: it subtracts.\n\n{TARGET}\n```python\n<<<<<<< SEARCH\n{BUG_LINE}\n=======\n{FIX_LINE}\n>>>>>>> REPLACE\n```\n"
    notes = [part_path(k) for k in range(1, parts + 1)] if parts else [NOTES] if big else []
    return f"To fix this I need to see {', '.join([TARGET, *notes])}. Please add them to the chat."


def side_reply(text: str) -> str:
    """A request without the agent's tools (a title, a commit message): a short plain answer of the shape asked."""
    if re.search(r"commit message", text[:3000], re.I):
        return "fix: add_totals adds its arguments"
    if re.search(r'JSON with a single "title"', text):
        return '{"title": "Fix add_totals bug"}'
    return "Fix add_totals bug" if re.search(r"title", text[-2000:], re.I) else "OK."
