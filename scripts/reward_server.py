# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A small HTTP reward server on localhost, as remote reward models and verifiers are served, and its client reward
function: the built-in `exact_match` reward behind a network call that takes `--delay` seconds.

    python scripts/reward_server.py --port 8421 --delay 0.3        # serves until interrupted (Ctrl-C)
    export TRAPO_REWARD_URL=http://127.0.0.1:8421
    python examples/trapo.py --reward_funcs scripts.reward_server.remote_exact_match   # from the repository root

The server (standard library only: `http.server.ThreadingHTTPServer`) answers

- `POST /score` with the JSON body `{"completions": [str, ...], "answer": [str, ...]}` (one completion text and one
  reference answer per row, the dataset's `answer` column) by `{"rewards": [float, ...]}`: exactly what the built-in
  `trl_trapo.tasks.exact_match_reward` returns on them, after sleeping `--delay` seconds (once per call: the client
  sends one batched call per reward-function call). A malformed body is answered with status 400 and
  `{"error": "..."}`;
- `GET /health` with `{"status": "ok", "delay": ..., "calls": ...}` (`calls`: the `/score` calls answered so far, so a
  caller can count the reward calls of a run).

`remote_exact_match` is the client: a reward function with TRL's signature (`completions`, `answer`, other columns
ignored) that reads the server's address from the `TRAPO_REWARD_URL` environment variable (`http://HOST:PORT`, with or
without `/score`; `TRAPO_REWARD_TIMEOUT` seconds per call, default 60), POSTs the batch with `urllib.request` and
returns the rewards. It is a module-level function, so it pickles (by reference): a rollout producer started with the
`spawn` method can call it. Conversational completions (lists of message dicts) are sent as the text of their
assistant messages, the text `exact_match_reward` reads from them. Any failure (variable unset, server unreachable,
timeout, an error status, a malformed answer) raises a `RemoteRewardError` that names the address and the fix; the
trainer reports it as a failing reward function.

`--reward_funcs scripts.reward_server.remote_exact_match` imports this file as the module `scripts.reward_server`
(`scripts/` is a namespace package, without `__init__.py`): launch the main job from the repository root, which
`--reward_funcs` searches first. `scripts/experiments/compare_async.py` starts this server itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[1]
URL_VARIABLE = "TRAPO_REWARD_URL"
TIMEOUT_VARIABLE = "TRAPO_REWARD_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
MAX_BODY_BYTES = 64 * 1024 * 1024


# =====================================================================================================================
# The server
# =====================================================================================================================
class RewardHandler(BaseHTTPRequestHandler):
    """`POST /score` and `GET /health` (see the module's docstring); the server holds `delay` and the call count."""

    server: RewardServer
    protocol_version = "HTTP/1.1"  # keep-alive, with Content-Length on every answer

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0].rstrip("/") != "/health":
            self._send(404, {"error": f"no such path {self.path!r}; use POST /score or GET /health"})
            return
        self._send(200, {"status": "ok", "delay": self.server.delay, "calls": self.server.calls})

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0].rstrip("/") != "/score":
            self._send(404, {"error": f"no such path {self.path!r}; use POST /score or GET /health"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                raise ValueError(f"the body must be JSON of 1..{MAX_BODY_BYTES} bytes with a Content-Length")
            request = json.loads(self.rfile.read(length))
            completions, answers = parse_request(request)
        except (ValueError, UnicodeDecodeError) as error:  # json.JSONDecodeError is a ValueError
            self._send(400, {"error": str(error)})
            return
        time.sleep(self.server.delay)  # the remote model's / verifier's latency, once per batched call
        try:
            rewards = self.server.score(completions, answers)
        except Exception as error:  # answered, not a dropped connection the client would report as unreachable
            self._send(500, {"error": f"scoring failed: {type(error).__name__}: {error}"})
            return
        with self.server.lock:
            self.server.calls += 1
        self._send(200, {"rewards": rewards})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        if self.server.verbose:
            super().log_message(format, *args)


def parse_request(request: Any) -> tuple[list[str], list[str]]:
    """The completions and answers of a `/score` body.

    Raises:
        ValueError: if the body is not an object with `completions` and `answer`, lists of strings of one length.
    """
    if not isinstance(request, dict):
        raise ValueError(
            f'the body must be a JSON object {{"completions": [...], "answer": [...]}}, got {request!r:.80}'
        )
    fields = {}
    for key in ("completions", "answer"):
        value = request.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key!r} must be a list of strings, got {value!r:.80}")
        fields[key] = value
    if len(fields["completions"]) != len(fields["answer"]):
        raise ValueError(
            f"got {len(fields['completions'])} completions but {len(fields['answer'])} answers; they must match one "
            "to one"
        )
    return fields["completions"], fields["answer"]


class RewardServer(ThreadingHTTPServer):
    """A `ThreadingHTTPServer` that scores with the built-in `exact_match_reward` after `delay` seconds per call.

    Args:
        port (`int`): the port on 127.0.0.1 (0: a free one, read back from `port`).
        delay (`float`): seconds each `/score` call sleeps before answering.
        verbose (`bool`): log every request on stderr (http.server's log lines).
    """

    daemon_threads = True

    def __init__(self, port: int = 0, delay: float = 0.0, verbose: bool = False):
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay}")
        if str(ROOT) not in sys.path:  # this checkout's trl_trapo (`python scripts/reward_server.py` puts scripts/)
            sys.path.insert(0, str(ROOT))
        from trl_trapo.tasks import exact_match_reward

        self.score = lambda completions, answers: exact_match_reward(None, completions, answers)
        self.delay, self.verbose, self.calls, self.lock = float(delay), verbose, 0, threading.Lock()
        super().__init__(("127.0.0.1", port), RewardHandler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`, the value for `TRAPO_REWARD_URL`."""
        return f"http://127.0.0.1:{self.port}"


def start_server(port: int = 0, delay: float = 0.0) -> tuple[RewardServer, threading.Thread]:
    """A `RewardServer` serving in a daemon thread; stop it with `server.shutdown(); server.server_close()`."""
    server = RewardServer(port, delay)
    thread = threading.Thread(target=server.serve_forever, name="reward-server", daemon=True)
    thread.start()
    return server, thread


# =====================================================================================================================
# The client: a reward function for `--reward_funcs scripts.reward_server.remote_exact_match`
# =====================================================================================================================
class RemoteRewardError(RuntimeError):
    """The remote reward could not be computed; the message names the server's address and the fix."""


def completion_text(completion: Any) -> str:
    """What `exact_match_reward` reads from a completion: a string as it is, the joined `content` of the assistant
    messages of a conversational one (a list of message dicts, or one dict).

    Raises:
        TypeError: if the completion is neither a string nor message dicts.
    """
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, list):
        return "".join(
            str(message.get("content") or "")
            for message in completion
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant"
        )
    if not isinstance(completion, str):
        raise TypeError(f"A completion must be a string or a list of message dicts, got {type(completion).__name__}.")
    return completion


def score_url(base: str) -> str:
    """The `/score` address of a server given as `http://HOST:PORT` (or already ending with `/score`)."""
    base = base.strip().rstrip("/")
    return base if base.endswith("/score") else base + "/score"


def remote_exact_match(completions: list, answer: list, **kwargs: Any) -> list[float]:
    """Exact-match rewards computed by the reward server at `$TRAPO_REWARD_URL`, one batched POST per call.

    Args:
        completions (`list[str]` or `list[list[dict]]`): standard or conversational completions.
        answer (`list[str]`): the reference answers (the dataset's `answer` column).
        **kwargs: the other columns and trainer extras (`prompts`, `trainer_state`, ...); not sent.

    Returns:
        `list[float]`: one reward in {0.0, 1.0} per completion, as `exact_match_reward` scores it.

    Raises:
        RemoteRewardError: if `TRAPO_REWARD_URL` is unset, the server cannot be reached or times out, answers with
            an error status, or answers something that is not one reward per completion.
    """
    base = os.environ.get(URL_VARIABLE)
    if not base:
        raise RemoteRewardError(
            f"{URL_VARIABLE} is not set: start the server (`python scripts/reward_server.py --port 8421`) and set "
            f"{URL_VARIABLE}=http://127.0.0.1:8421 in the environment of the run."
        )
    url = score_url(base)
    timeout = float(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S)
    body = json.dumps({"completions": [completion_text(c) for c in completions], "answer": [str(a) for a in answer]})
    request = urllib.request.Request(
        url, data=body.encode("utf-8"), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = json.loads(response.read())
    except urllib.error.HTTPError as error:  # before URLError: it is one
        detail = error.read().decode("utf-8", "replace")[:500]
        raise RemoteRewardError(
            f"the reward server at {url} answered {error.code} {error.reason}: {detail}"
        ) from error
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        raise RemoteRewardError(
            f"cannot reach the reward server at {url} ({type(reason).__name__}: {reason}; timeout {timeout:g} s, "
            f"{TIMEOUT_VARIABLE} sets it): is `python scripts/reward_server.py` running on that port, and is "
            f"{URL_VARIABLE}={base!r} its address?"
        ) from error
    except ValueError as error:  # the body is not JSON
        raise RemoteRewardError(f"the reward server at {url} answered something that is not JSON: {error}") from error
    rewards = payload.get("rewards") if isinstance(payload, dict) else None
    if (
        not isinstance(rewards, list)
        or len(rewards) != len(completions)
        or not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards)
    ):
        raise RemoteRewardError(
            f"the reward server at {url} answered {payload!r:.200}; expected {{'rewards': [...]}} with "
            f"{len(completions)} numbers."
        )
    return [float(r) for r in rewards]


# =====================================================================================================================
# Command line
# =====================================================================================================================
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--port", type=int, default=8421, help="port on 127.0.0.1 (0: a free one, printed)")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds each /score call sleeps (default 0.3)")
    parser.add_argument("--verbose", action="store_true", help="log every request on stderr")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    if args.delay < 0:
        raise SystemExit(f"--delay must be >= 0 seconds, got {args.delay}.")
    server = RewardServer(args.port, args.delay, args.verbose)
    print(f"Serving exact_match at {server.url} (POST /score, GET /health), {args.delay:g} s per call", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
