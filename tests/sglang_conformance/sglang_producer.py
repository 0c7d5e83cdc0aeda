"""kvscope's side of produce_with_sglang.py: SGLang's own code, in .venv-sglang, as a process.

The process is started with the flags kvscope launches SGLang with; each method sends one
command and returns SGLang's reply. restart() replaces the process (new Prometheus state, same
port), which is what a restarted engine looks like to a scraper.
"""

import json
import selectors
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.engines.sglang import SglangEngine

SCRIPT = Path(__file__).with_name("produce_with_sglang.py")
START_TIMEOUT_S = 300.0  # importing SGLang's metrics code takes 3-9 s; a cold disk, more
CALL_TIMEOUT_S = 60.0


class SglangError(RuntimeError):
    pass


class SglangProducer:
    def __init__(self, python: Path, argv: list[str], log: Path) -> None:
        self.python, self.argv, self.log = python, argv, log
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}
        self.start()

    @property
    def metrics_url(self) -> str:
        return f"http://{self.info['host']}:{self.info['port']}/metrics"

    def start(self) -> None:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(
                [str(self.python), str(SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=SCRIPT.parent,
            )
        self.info = self.call("init", timeout_s=START_TIMEOUT_S, argv=self.argv)

    def call(self, op: str, *, timeout_s: float = CALL_TIMEOUT_S, **args: Any) -> dict[str, Any]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                raise SglangError(f"SGLang gave no answer to {op!r} in {timeout_s:g} s")
        line = proc.stdout.readline()
        if not line:
            raise SglangError(f"the SGLang process ended during {op!r}:\n{self.log_tail()}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise SglangError(f"SGLang failed on {op!r}:\n{reply['error']}")
        return reply

    def served(self) -> int:
        """GET /metrics requests begun so far (by this process)."""
        return int(self.call("served")["served"])

    def wait_scraped(self, timeout_s: float = 10.0) -> None:
        """Until a scrape that began after this call has been recorded: the scraper sends the
        next request only once the previous one is recorded, so two more GETs suffice."""
        target = self.served() + 2
        deadline = time.monotonic() + timeout_s
        while self.served() < target:
            if time.monotonic() > deadline:
                raise SglangError(f"no /metrics scrape within {timeout_s:g} s")
            time.sleep(0.02)

    def restart(self) -> None:
        self.close()
        self.start()

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            proc.stdin.close()
            proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=15)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass(frozen=True)
class FinishedRequest:
    """A request as the test feeds it to SGLang's code; the expected values derive from it."""

    rid: str
    agent: str
    prompt_tokens: int
    completion_tokens: int = 24
    device_hit: int = 0
    host_hit: int = 0
    cache_details: bool = True  # False: SGLang gets only the total (cache_source="total")
    dispatch_s: float = 0.004  # created -> the scheduler's wait queue
    queue_s: float = 0.05
    prefill_s: float = 0.02
    decode_s: float = 0.2
    stream: bool = False

    @property
    def cached_tokens(self) -> int:
        return self.device_hit + self.host_hit

    @property
    def ttft_s(self) -> float:
        return self.dispatch_s + self.queue_s + self.prefill_s

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + self.decode_s

    def send(self, sglang: SglangProducer, engine: SglangEngine) -> dict[str, Any]:
        """Through SGLang, tagged as kvscope tags it (body fields and the agent header)."""
        body, headers = engine.request_tags(self.rid, self.agent)
        details = {"device": self.device_hit, "host": self.host_hit}
        return sglang.call(
            "request",
            body=body,
            headers=headers,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            cached_details=details if self.cache_details and self.cached_tokens else None,
            dispatch_s=self.dispatch_s,
            queue_s=self.queue_s,
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            stream=self.stream,
        )
