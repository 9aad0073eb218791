"""A new user's first minutes on the embedded model, measured: what `make run` and the README promise.

Against a proxy already serving the embedded model (`make run`, then
``--url http://127.0.0.1:8000``), or one this script starts (`pcp-proxy serve`
with no upstream). It measures, with the SDKs a user would use:

* the README's Python example (``Hello!``, no ``max_tokens``): seconds and finish_reason;
* ``client.responses.create`` and ``anthropic.Anthropic().messages.create``, short and
  long (a 660-message history, ~10k tokens: protocol mode), streamed and not;
* a client that leaves a long generation (streamed, then one that gives up on a whole
  answer): seconds until a second request has its answer;
* llama-server's resident memory before and after 100 requests (90 short ones, 10 with
  distinct ~2,400-token prompts).

    .venv/bin/python bench/first_run.py [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
import openai

ENDLESS = {"logit_bias": {"0": -100, "2": -100}, "temperature": 0.8}  # SmolLM2's ends of turn and text forbidden
HELLO = [{"role": "user", "content": "Hello!"}]


def history() -> list[dict]:
    """~10k tokens: above the default threshold (8,192), so protocol mode pages it into a 4,096-token prompt."""
    said = []
    for i in range(330):
        said += [{"role": "user", "content": f"Note {i}: the greenhouse needs watering on day {i}."}, {"role": "assistant", "content": f"Noted, day {i}."}]
    return [*said, {"role": "user", "content": "Which note mentioned day 7?"}]


def timed(work):
    start = time.monotonic()
    result = work()
    return time.monotonic() - start, result


def start_proxy(port: int) -> subprocess.Popen:
    data = tempfile.mkdtemp(prefix="pcp-first-run-")
    env = {**os.environ, "PCP_PORT": str(port), "PCP_DATA_DIR": data, "PCP_ROUTER_EMBEDDINGS": "false"}
    process = subprocess.Popen([sys.executable, "-m", "proxy.cli.main", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the proxy did not start")


def server_pid(proxy_pid: int | None) -> int | None:
    """llama-server's process: the proxy's child of that name (or, with --url, the only one on the machine)."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if command.endswith(b"llama-server") and (proxy_pid is None or parent == proxy_pid):
            return pid
    return None


def cores(pid: int | None, seconds: float = 1.0) -> float:
    """The cores llama-server keeps busy over the next ``seconds`` (1.0: one core all the time)."""
    if pid is None:
        return float("nan")

    def used() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    start = used()
    time.sleep(seconds)
    return (used() - start) / seconds


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a proxy already serving the embedded model")
    parser.add_argument("--port", type=int, default=18765)
    args = parser.parse_args()
    process = None if args.url else start_proxy(args.port)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        run(url, process.pid if process else None)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


def run(url: str, proxy_pid: int | None) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-...", max_retries=0, timeout=300)
    claude = anthropic.Anthropic(base_url=url, api_key="sk-ant-...", max_retries=0, timeout=300)
    rows: list[tuple[str, float, str]] = []

    seconds, reply = timed(lambda: client.chat.completions.create(model="smollm2-135m", messages=HELLO))
    rows.append(("README example (Hello!, no max_tokens)", seconds, f"finish_reason={reply.choices[0].finish_reason}, {reply.usage.completion_tokens} tokens"))
    for long in (False, True):
        said = history() if long else HELLO
        kind = "long (protocol mode)" if long else "short"
        seconds, response = timed(lambda said=said: client.responses.with_raw_response.create(model="m", input=said, max_output_tokens=64))
        rows.append((f"responses.create, {kind}", seconds, f"{response.headers['x-pcp-mode']}, status={response.parse().status}"))
        seconds, events = timed(lambda said=said: list(client.responses.create(model="m", input=said, max_output_tokens=64, stream=True)))
        rows.append((f"responses.create stream, {kind}", seconds, f"{len(events)} events, last {events[-1].type}"))
        seconds, message = timed(lambda said=said: claude.messages.with_raw_response.create(model="m", max_tokens=64, messages=said))
        rows.append((f"messages.create, {kind}", seconds, f"{message.headers['x-pcp-mode']}, stop_reason={message.parse().stop_reason}"))

        def streamed(said=said):
            with claude.messages.stream(model="m", max_tokens=64, messages=said) as stream:
                return stream.get_final_message()

        seconds, final = timed(streamed)
        rows.append((f"messages.stream, {kind}", seconds, f"stop_reason={final.stop_reason}"))

    pid = server_pid(proxy_pid)

    def next_answer(check: str, cpu: str) -> None:
        """Once a client has left: llama-server's CPU the second after (``{after}`` in ``cpu``), and how soon the next request is answered."""
        after = cores(pid)
        seconds, reply = timed(lambda: client.chat.completions.create(model="m", messages=HELLO, max_tokens=16))
        rows.append((check, seconds, f"{reply.choices[0].finish_reason}; " + cpu.format(after=after)))

    body = {"model": "m", "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 3000, **ENDLESS}
    with httpx.Client(base_url=url, timeout=60) as http, http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        lines = stream.iter_lines()
        for _ in range(30):
            next(lines)
        busy = cores(pid)
    next_answer("a client left a stream: the next answer", f"llama-server {busy:.2f} cores generating, {{after:.2f}} the second after")
    try:
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=3.0))
    except httpx.ReadTimeout:
        pass
    next_answer("a client gave up on a whole answer (3 s): the next answer", "llama-server {after:.2f} cores the second after")

    before = rss_mb(pid) if pid else 0.0
    filler = " ".join(f"word{i}" for i in range(500))  # ~2,400 of SmolLM2's tokens
    seconds, _ = timed(
        lambda: [
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"{i}: {filler} {i}" if i % 10 == 0 else f"Say a number near {i}."}], max_tokens=16
            )
            for i in range(100)
        ]
    )
    after = rss_mb(pid) if pid else 0.0
    rows.append(
        ("100 requests (10 with distinct ~2,400-token prompts)", seconds, f"llama-server RSS {before:.0f} -> {after:.0f} MB (peak {_peak(pid):.0f} MB)")
    )

    print("| check | seconds | result |\n|---|---|---|")
    for name, seconds, result in rows:
        print(f"| {name} | {seconds:.2f} | {result} |")


def _peak(pid: int | None) -> float:
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    main()
