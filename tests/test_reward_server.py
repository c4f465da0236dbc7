# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`scripts/reward_server.py`: the HTTP reward server scores as the built-in `exact_match` reward does, after its delay;
its client `remote_exact_match` fails clearly without a server, pickles and runs in a `spawn` process (as an
asynchronous rollout producer calls reward functions), and drives a short main job
(`--reward_funcs scripts.reward_server.remote_exact_match`).
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import run_script

from trl_trapo.rewards import RewardFunctionError, call_reward_function
from trl_trapo.tasks import exact_match_reward, make_task_suite


ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `scripts.reward_server`, the module name the main job imports it by
    sys.path.insert(0, str(ROOT))

import scripts.reward_server as reward_server  # noqa: E402


DELAY = 0.1


@pytest.fixture(scope="module")
def server():
    server, thread = reward_server.start_server(port=0, delay=DELAY)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def url(server, monkeypatch):
    monkeypatch.setenv(reward_server.URL_VARIABLE, server.url)
    return server.url


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


COMPLETIONS = [
    "bafc",  # right
    "bafd",  # wrong
    "  bafc.  ",  # right: whitespace and a trailing full stop are ignored
    "bafc</s>junk",  # right: cut at the eos text
    "",  # wrong: empty
    "b",
    [{"role": "assistant", "content": "bafc"}],  # conversational, right
    [{"role": "assistant", "content": "ba"}, {"role": "assistant", "content": "fc"}],  # joined: right
    [{"role": "user", "content": "bafc"}, {"role": "assistant", "content": "x"}],  # the user's text is not read
    {"role": "assistant", "content": "bafc!"},  # one message dict
    [{"role": "assistant", "content": None}],
]
ANSWERS = ["bafc"] * 5 + ["b"] + ["bafc"] * 5


def test_rewards_equal_the_builtin_exact_match(url):
    expected = exact_match_reward(None, COMPLETIONS, ANSWERS)
    assert 0 < sum(expected) < len(expected)  # both rewards occur
    assert reward_server.remote_exact_match(prompts=None, completions=COMPLETIONS, answer=ANSWERS) == expected


def test_rewards_equal_the_builtin_exact_match_on_the_task_suite(url):
    """The suite's held-out rows: every answer right, then every answer paired with another row's (mostly wrong)."""
    suite = make_task_suite(seed=0, num_pretrain_docs=10, num_sft_per_task=5, num_rl_per_task=5, num_eval_per_task=6)
    answers = list(suite.eval["answer"])
    shifted = answers[1:] + answers[:1]
    kwargs = {"prompts": list(suite.eval["prompt"]), "task": list(suite.eval["task"]), "trainer_state": None}
    for completions in (answers, shifted, [a + "</s>" for a in shifted]):
        expected = exact_match_reward(None, completions, answers)
        assert reward_server.remote_exact_match(completions=completions, answer=answers, **kwargs) == expected
    assert sum(exact_match_reward(None, shifted, answers)) < len(answers)


def test_each_call_is_one_request_that_takes_the_delay(server, url):
    calls = get_json(server.url + "/health")["calls"]
    start = time.perf_counter()
    reward_server.remote_exact_match(completions=["a", "b", "c"], answer=["a", "b", "x"])
    assert time.perf_counter() - start >= DELAY
    health = get_json(server.url + "/health")
    assert health["status"] == "ok" and health["delay"] == DELAY
    assert health["calls"] == calls + 1  # one batched call for three completions


def test_bad_requests_are_answered_with_an_error(server):
    status, payload = post(server.url + "/score", b'{"completions": ["a"], "answer": ["a", "b"]}')
    assert status == 400 and "1 completions but 2 answers" in payload["error"]
    status, payload = post(server.url + "/score", b"not json")
    assert status == 400 and payload["error"]
    status, payload = post(server.url + "/score", b'{"completions": [1], "answer": ["a"]}')
    assert status == 400 and "'completions' must be a list of strings" in payload["error"]
    status, payload = post(server.url + "/other", b"{}")
    assert status == 404 and "/score" in payload["error"]


def test_an_unreachable_server_is_a_clear_error(monkeypatch):
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv(reward_server.URL_VARIABLE, address)
    with pytest.raises(reward_server.RemoteRewardError, match=r"cannot reach the reward server at .*/score"):
        reward_server.remote_exact_match(completions=["a"], answer=["a"])
    # as the trainer calls it: the error names the function and says what it raised
    kwargs = dict(prompts=["p"], completions=["a"], answer=["a"])
    with pytest.raises(RewardFunctionError, match="'remote_exact_match' raised RemoteRewardError: cannot reach"):
        call_reward_function(reward_server.remote_exact_match, "remote_exact_match", 1, kwargs)


def test_an_unset_address_names_the_variable(monkeypatch):
    monkeypatch.delenv(reward_server.URL_VARIABLE, raising=False)
    with pytest.raises(reward_server.RemoteRewardError, match="TRAPO_REWARD_URL is not set"):
        reward_server.remote_exact_match(completions=["a"], answer=["a"])


def test_an_error_status_is_reported_with_the_servers_message(url, monkeypatch):
    monkeypatch.setenv(reward_server.URL_VARIABLE, url + "/nowhere")
    with pytest.raises(reward_server.RemoteRewardError, match="answered 404.*use POST /score"):
        reward_server.remote_exact_match(completions=["a"], answer=["a"])


def test_the_main_jobs_reward_flag_imports_the_client_from_the_repository_root(monkeypatch):
    """`--reward_funcs scripts.reward_server.remote_exact_match`: `scripts/` has no `__init__.py`; it imports as a
    namespace package from the launch directory."""
    from trl_trapo.jobs.main import resolve_reward_func

    assert not (ROOT / "scripts" / "__init__.py").exists()
    monkeypatch.chdir(ROOT)
    assert resolve_reward_func("scripts.reward_server.remote_exact_match") is reward_server.remote_exact_match


def test_the_client_pickles_and_runs_in_a_spawned_process(url):
    """What an asynchronous rollout producer (a `spawn` process) does with the reward functions it is given."""
    func = reward_server.remote_exact_match
    assert pickle.loads(pickle.dumps(func)) is func
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        rewards = pool.apply(func, kwds={"completions": ["ab", "x"], "answer": ["ab", "ab"]})
    assert rewards == [1.0, 0.0]


def test_the_main_job_runs_with_the_remote_reward(server, url, tmp_path, monkeypatch):
    """3 steps of the built-in job with `--reward_funcs scripts.reward_server.remote_exact_match`, run from the
    repository root as the module's docstring says (in this process, `run_script`: the subject is the reward's import
    path and the server, not the process)."""
    calls = get_json(server.url + "/health")["calls"]
    argv = [
        *("--reward_funcs", "scripts.reward_server.remote_exact_match"),
        *("--max_steps", "3", "--max_eval_samples", "4", "--eval_strategy", "no"),
        *("--output_dir", str(tmp_path / "out")),
    ]
    monkeypatch.chdir(ROOT)
    assert run_script(ROOT / "examples" / "trapo.py", argv, monkeypatch) == 0
    assert get_json(server.url + "/health")["calls"] > calls  # the rewards came from the server
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/remote_exact_match/mean" in h for h in history), history[0].keys()
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert "eval_rewards/remote_exact_match" in results and "eval_accuracy" in results
