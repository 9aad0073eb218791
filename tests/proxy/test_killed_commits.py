"""A session on the embedded store survives a kill -9 at any step of a commit: it is held whole, old or new."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_commit_killed_at_any_step_leaves_the_session_whole_old_or_new(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "tests.proxy.killed_commits", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"step"')]
    *killed, lived = steps
    assert len(killed) > 20 and all(step["killed"] for step in killed) and not lived["killed"]
    assert lived["found"] == "new" and lived["replaced_files"] > 0  # the follow-up replaced values held in files
    assert lived["unnamed_files"] == 0  # and removed their files once it had committed
    lost = [step["step"] for step in killed if step["found"] not in ("old", "new")]
    assert not lost, f"killed before step {lost} of {len(killed)}, the store held neither version"
    found = Counter(step["found"] for step in killed)
    assert found["old"] and found["new"]  # kills before the switch and after it
