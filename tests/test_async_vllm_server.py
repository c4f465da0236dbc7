# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts through a vLLM server (`async_rollouts=True, use_vllm=True, vllm_mode="server"`), on CPU,
against a fake server.

`FakeVLLMServer` is a stdlib HTTP server (a thread of the test process, on a free port) with exactly the endpoints
the path uses: TRL's `VLLMClient` in the producer (`/health`, `/v1/models`, `/v1/completions` with token-id prompts
and log-probs) and in the trainer (the same, `/server_info`, `/get_world_size`, `/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights`, `/finish_weight_update`, `/reset_prefix_cache`). It samples with the tiny
model the trainer starts from, so its log-probs are real (`processed_logprobs`: of the temperature-scaled
distribution), minus `logprob_shift`: a sampler that finds every token exp(shift) times less likely than the trainer,
so the mismatch correction has something to correct.

Stubs, at the narrowest points (vLLM is not installed here, and its weight transfer needs CUDA and NCCL):
- `trl.generation.*.is_vllm_available` say True, in the trainer and in the producer (`cpu_vllm_client`): TRL's
  client refuses to be built without vLLM although its HTTP half needs only `requests`;
- `VLLMClient.init_communicator` does the HTTP half of TRL's (server info, world size, `/init_weight_transfer_engine`)
  and sets a stand-in group instead of the NCCL rendezvous;
- the NCCL broadcast of the weights (`NCCLWeightTransferEngine.trainer_send_weights`, or vLLM >= 0.28's
  `packed_nccl_broadcast_producer`) hands the tensors to the fake server, in process; everything around it is TRL's
  real code (`VLLMGeneration.sync_weights`: names, metadata, `/update_weights` and the other HTTP calls).
`scripts/benchmarks/gpu_check.py` runs the real vLLM server where vLLM and a GPU are present.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
import torch
from conftest import TINY_CONFIG
from transformers import AutoModelForCausalLM

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.async_rollouts import ProducerError
from trl_trapo.rollout import cut_after_stop
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, make_task_suite


vllm_client = pytest.importorskip(
    "trl.generation.vllm_client", reason="TRL's VLLMClient cannot be imported here (it needs `requests`)"
)


class FakeVLLMServer:
    """The endpoints of `trl vllm-serve` (module docstring), sampling with a transformers model.

    Records, in order, `events`: `("completions", prompt ids, n, temperature, seed, weights generation, in flight)`,
    and `(endpoint, in flight)` for the weight-transfer endpoints (`in flight`: completion requests being served when
    the event happened). `served[(prompt, completion)]` is `(log-probs, weights generation)` of every completion it
    returned; the weights generation is the number of weight pushes finished before it was sampled.
    """

    def __init__(self, model_dir, logprob_shift: float = 0.0):
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.name = str(model_dir)
        self.logprob_shift = logprob_shift
        self.model_lock = threading.Lock()  # sampling and loading weights, one at a time
        self.events_lock = threading.Lock()
        self.events: list[tuple] = []
        self.served: dict[tuple, tuple[list[float], int]] = {}
        self.in_flight = 0
        self.generation = 0
        self.received: dict[str, torch.Tensor] = {}  # the weights broadcast "over NCCL" (the stub), not yet loaded
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def reply(self, payload: dict, status: int = 200) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = urlparse(self.path).path
                if path == "/health":
                    self.reply({})
                elif path == "/v1/models":
                    self.reply({"data": [{"id": server.name}]})
                elif path == "/server_info":
                    config = {"model_config": {"logprobs_mode": "processed_logprobs"}}
                    self.reply({"vllm_config": {**config, "weight_transfer_config": {"backend": "nccl"}}})
                elif path == "/get_world_size":
                    self.reply({"world_size": 1})
                else:
                    self.reply({"error": path}, 404)

            def do_POST(self):
                path = urlparse(self.path).path
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if path == "/v1/completions":
                    self.reply(server.complete(body))
                elif path in ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights"):
                    server.record(path[1:])
                    self.reply({})
                elif path == "/finish_weight_update":
                    server.load_received()
                    self.reply({})
                elif path == "/reset_prefix_cache":
                    server.record("reset_prefix_cache")
                    self.reply({"success": True})
                else:
                    self.reply({"error": path}, 404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def record(self, *event) -> None:
        with self.events_lock:
            self.events.append((*event, self.in_flight))

    def complete(self, body: dict) -> dict:
        with self.events_lock:
            self.in_flight += 1
        try:
            assert body["return_token_ids"] and body["logprobs"] == 0 and body["top_k"] == 0 and body["top_p"] == 1.0
            stops = set(body.get("stop_token_ids") or [])
            choices = []
            with self.model_lock:
                for prompt in body["prompt"]:
                    for i in range(body["n"]):
                        generator = torch.Generator().manual_seed(body["seed"] + i)  # vLLM: seed + i for child i
                        ids, completion, logps = list(prompt), [], []
                        for _ in range(body["max_tokens"]):
                            with torch.no_grad():
                                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                            logp = torch.log_softmax(logits / body["temperature"], -1)
                            token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                            ids.append(token)
                            completion.append(token)
                            logps.append(float(logp[token]) - self.logprob_shift)
                            if token in stops:
                                break
                        self.served[(tuple(prompt), tuple(completion))] = (logps, self.generation)
                        choices.append(
                            {
                                "prompt_token_ids": prompt,
                                "token_ids": completion,
                                "logprobs": {
                                    "tokens": [f"token_id:{t}" for t in completion],
                                    "token_logprobs": logps,
                                    "top_logprobs": [None] * len(completion),
                                },
                            }
                        )
                    self.record("completions", tuple(prompt), body["n"], body["temperature"], body["seed"],
                                self.generation)  # fmt: skip
            return {"choices": choices}
        finally:
            with self.events_lock:
                self.in_flight -= 1

    def load_received(self) -> None:
        with self.model_lock:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, value in self.received.items():
                    params[name].copy_(value)
            self.received = {}
            self.generation += 1
        self.record("finish_weight_update")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def cpu_vllm_client(url: str, timeout: float):
    """The producer's client (runs in the spawned producer): TRL's `VLLMClient`, told that vLLM is installed."""
    import trl.generation.vllm_client as client_module

    client_module.is_vllm_available = lambda *args, **kwargs: True
    return client_module.VLLMClient(base_url=url, connection_timeout=timeout)


def distinct_characters(completions, **kwargs) -> list[float]:
    """A reward with variance within a group (so the policy moves and the producer's weights fall behind); module
    level, so the producer can import it."""
    return [float(len(set(completion))) for completion in completions]


def dead_url() -> str:
    """A URL nothing listens on (a port just released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def unreachable_from_the_producer(url: str, timeout: float):
    """A producer on a host from which the server cannot be reached (the trainer reaches it)."""
    return cpu_vllm_client(dead_url(), 0.0)


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=10, num_eval_per_task=2)


@pytest.fixture
def model_dir(tmp_path):
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def install_stubs(monkeypatch) -> SimpleNamespace:
    """vLLM's absence and its NCCL weight transfer, stubbed through `monkeypatch` (a `pytest.MonkeyPatch`; module
    docstring); returns where the pushed weights go: set its `server` to the `FakeVLLMServer` that receives them.
    scripts/experiments/feature_matrix.py installs them too (its vLLM-server cells with async rollouts)."""
    import trl.generation.vllm_generation as vllm_generation

    import trl_trapo.async_rollouts as async_rollouts
    import trl_trapo.rollout as rollout

    for module in (rollout, vllm_generation, vllm_client):
        monkeypatch.setattr(module, "is_vllm_available", lambda *args, **kwargs: True)
    monkeypatch.setattr(async_rollouts, "open_vllm_client", cpu_vllm_client)
    target = SimpleNamespace(server=None, pushes=0)

    def init_communicator(self, device=0):  # TRL's, without the NCCL rendezvous (CUDA only)
        assert self.get_server_info()["weight_transfer_config"] is not None
        world_size = self.get_world_size() + 1
        self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": {"world_size": world_size}})
        self.communicator = SimpleNamespace(group=None)

    def broadcast(iterator):  # the NCCL broadcast: the tensors reach the (in-process) server
        for name, tensor in iterator:
            target.server.received[name] = tensor.detach().clone()
        target.pushes += 1

    monkeypatch.setattr(vllm_client.VLLMClient, "init_communicator", init_communicator)
    monkeypatch.setattr(vllm_client, "get_ip", lambda: "127.0.0.1", raising=False)
    monkeypatch.setattr(vllm_client, "NCCLTrainerSendWeightsArgs", SimpleNamespace, raising=False)
    monkeypatch.setattr(
        vllm_client,
        "NCCLWeightTransferEngine",
        SimpleNamespace(trainer_send_weights=lambda iterator, trainer_args: broadcast(iterator)),
        raising=False,
    )
    monkeypatch.setattr(
        vllm_client,
        "packed_nccl_broadcast_producer",
        lambda iterator, group, src, post_iter_func: broadcast(iterator),
        raising=False,
    )
    return target


@pytest.fixture
def stubs(monkeypatch):
    """`install_stubs` for one test."""
    return install_stubs(monkeypatch)


@pytest.fixture
def server(model_dir, stubs):
    server = FakeVLLMServer(model_dir, logprob_shift=0.1)
    stubs.server = server
    yield server
    server.close()


def vllm_async_trainer(model_dir, suite, url, **overrides):
    values = dict(
        TINY_CONFIG,
        output_dir=str(model_dir.parent / "out"),
        async_rollouts=True,
        max_staleness=2,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_server_timeout=0.0,
    )
    values.update(overrides)
    return TRAPOTrainer(
        AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=distinct_characters,
        args=TRAPOConfig(**values),
        train_dataset=suite.rl_train,
        processing_class=build_char_tokenizer(),
    )


def record_pushes_and_rounds(trainer, monkeypatch) -> tuple[list[int], list[tuple]]:
    """Records the versions pushed to the server, in order, and every round consumed: `(step, sampled, finished)`."""
    source, pushes, rounds = trainer.rollout_source, [], []
    push, finish = source._push, trainer.rollouts.finish

    def recording_push(step):
        push(step)
        pushes.append(step)

    def recording_finish(sampled, **kwargs):
        batch = finish(sampled, **kwargs)
        rounds.append((trainer.state.global_step, sampled, batch))
        return batch

    monkeypatch.setattr(source, "_push", recording_push)
    monkeypatch.setattr(trainer.rollouts, "finish", recording_finish)
    return pushes, rounds


def served(server, prompt: torch.Tensor, completion: torch.Tensor) -> tuple[list[float], int]:
    """What the server returned for this prompt and this (cut) completion: its log-probs and weights generation."""
    stop = [build_char_tokenizer().eos_token_id]
    match = [
        entry
        for (p, c), entry in server.served.items()
        if p == tuple(prompt.tolist()) and cut_after_stop(torch.tensor(c), stop).tolist() == completion.tolist()
    ]
    assert match, "a completion the server did not return"
    return match[0]


def test_training_on_the_servers_rounds_with_weight_pushes_in_order(model_dir, suite, server, monkeypatch):
    import trl_trapo.objectives as objectives

    weights = []

    def recording_rl_term(*args, **kwargs):
        weights.append((kwargs["sampling_weights"], args[3]))  # (mismatch weights, mask)
        return rl_term(*args, **kwargs)

    rl_term = objectives.rl_term
    monkeypatch.setattr(objectives, "rl_term", recording_rl_term)
    trainer = vllm_async_trainer(model_dir, suite, server.url, max_steps=5, num_ppo_epochs=1)
    pushes, rounds = record_pushes_and_rounds(trainer, monkeypatch)
    trainer.train()
    assert trainer.rollout_source.producer_pid is None  # stopped when train() returned

    # the server received the rounds' prompts, the trainer trained on its completions and got its log-probs
    assert rounds and len(pushes) >= 2 and pushes == sorted(set(pushes))
    requested = {event[1] for event in server.events if event[0] == "completions"}
    for step, sampled, batch in rounds:
        assert sampled.old_per_token_logps is None  # PPO's old log-probs: the trainer's own, computed in `finish`
        for prompt, completion, sampler, own in zip(
            sampled.prompt_ids, sampled.completion_ids, sampled.sampler_per_token_logps, batch.old_per_token_logps
        ):
            assert tuple(prompt.tolist()) in requested
            logps, generation = served(server, prompt, completion)
            torch.testing.assert_close(sampler, torch.tensor(logps[: completion.numel()]), atol=1e-6, rtol=0)
            # deterministic mode: the round was sampled with exactly the weights of its version
            assert generation == pushes.index(sampled.version) + 1, (generation, sampled.version, pushes)
            if sampled.version == step:  # lag 0: the same weights, so the gap is the server's shift alone
                torch.testing.assert_close(own - sampler, torch.full_like(own, 0.1), atol=1e-4, rtol=0)
    assert any(sampled.version == step for step, sampled, _ in rounds)
    assert any(sampled.version < step for step, sampled, _ in rounds)  # and the producer ran ahead

    # a push never changed the weights under a round being sampled (deterministic mode)
    kinds = [event[0] for event in server.events]
    assert kinds.count("init_weight_transfer_engine") == 1
    assert kinds.count("finish_weight_update") == len(pushes)
    for event in server.events:
        if event[0] in ("start_weight_update", "update_weights", "finish_weight_update"):
            assert event[-1] == 0, server.events  # no completion request in flight
    # the sampler log-probs reached the loss (mismatch correction) and the logs
    assert weights and all(w is not None for w, _ in weights)
    assert float(torch.cat([w[m.bool()] for w, m in weights]).mean()) > 1.05  # exp(0.1) per token, sequence_mask
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["sampling/sampling_logp_difference/mean"] == pytest.approx(0.1, abs=1e-3)  # step 0: lag 0
    assert sum(h["perf/weight_sync_s"] for h in logs) > 0
    assert max(h["sample/staleness_max"] for h in logs) <= 2


def test_free_running_pushes_whenever_due_and_stamps_a_lower_bound(model_dir, suite, server, monkeypatch):
    """Free-running mode: the weights are pushed every `weight_sync_steps` steps without waiting for the producer; a
    round is stamped with the version the producer knew when it started it, never newer than what sampled it."""
    trainer = vllm_async_trainer(
        model_dir, suite, server.url, max_steps=4, num_ppo_epochs=1, async_deterministic=False
    )
    pushes, rounds = record_pushes_and_rounds(trainer, monkeypatch)
    trainer.train()
    assert pushes == list(range(len(pushes))) and len(pushes) >= 3  # every step (weight_sync_steps=1)
    for step, sampled, _ in rounds:
        assert step - sampled.version <= 2
        for prompt, completion in zip(sampled.prompt_ids, sampled.completion_ids):
            _, generation = served(server, prompt, completion)
            assert generation >= pushes.index(sampled.version) + 1  # the stamp is a lower bound
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 4 and "sampling/sampling_logp_difference/mean" in logs[0]


def test_a_server_unreachable_at_construction_names_the_setting(model_dir, suite, stubs):
    url = dead_url()
    with pytest.raises(ConnectionError, match=f"(?s)No vLLM server answers at {url}.*vllm_server_base_url.*"
                       "trl vllm-serve --model"):  # fmt: skip
        vllm_async_trainer(model_dir, suite, url)


def test_a_server_gone_at_the_first_round_names_the_setting(model_dir, suite, server):
    trainer = vllm_async_trainer(model_dir, suite, server.url)
    server.close()
    with pytest.raises(ConnectionError, match="(?s)vllm_server_base_url; pushing the weights.*trl vllm-serve"):
        trainer.train()
    assert trainer.rollout_source.producer_pid is None  # never started


def test_a_producer_that_cannot_reach_the_server_names_the_setting(model_dir, suite, server, monkeypatch):
    import trl_trapo.async_rollouts as async_rollouts

    monkeypatch.setattr(async_rollouts, "open_vllm_client", unreachable_from_the_producer)
    trainer = vllm_async_trainer(model_dir, suite, server.url)
    with pytest.raises(ProducerError, match="(?s)while starting: No vLLM server answers.*vllm_server_base_url"):
        trainer.rollout_source.sample(8, 0)
    assert trainer.rollout_source.producer_pid is None


def test_rows_are_grouped_by_prompt_and_temperature_into_requests():
    """vLLM takes one temperature per request: a prompt's group is one request with `n` = group when its rows share a
    temperature, else one request per row; rows come back in order, cut after the stop token with their log-probs,
    and every request has its own seed."""
    from trl_trapo.async_rollouts import VLLMServerSpec, sample_from_server

    calls = []

    class Client:  # `VLLMClient.generate`'s contract: n completions per prompt, (C, 1) log-probs each
        def generate(self, prompts, n, temperature, **kwargs):
            calls.append((prompts[0][0], n, temperature, kwargs["generation_kwargs"]["seed"]))
            completions = [[prompts[0][0], 100 + i, 2, 7] for i in range(n)]  # 2 is the stop token: 7 is cut off
            return {"completion_ids": completions, "logprobs": [[[-0.5], [-1.0], [None], [-3.0]]] * n}

    spec = VLLMServerSpec("http://x", 0.0, "m", {"max_tokens": 4, "generation_kwargs": {"stop_token_ids": [2]}}, None)
    prompts = [[10]] * 4 + [[20]] * 4
    out = sample_from_server(Client(), spec, prompts, [1.0] * 4 + [0.7, 1.0, 1.0, 1.0], 4, seed=5, stop_token_ids=[2])
    assert sorted(call[:3] for call in calls) == [(10, 4, 1.0), (20, 1, 0.7), (20, 1, 1.0), (20, 1, 1.0), (20, 1, 1.0)]
    assert len({call[3] for call in calls}) == len(calls)
    assert [c.tolist() for c in out["completion_ids"]] == [[10, 100 + i, 2] for i in range(4)] + [[20, 100, 2]] * 4
    for logps in out["old_per_token_logps"]:
        assert logps[:2].tolist() == [-0.5, -1.0] and logps.numel() == 3 and logps[2].isnan()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # by design: TRL's colocate engine is a shard of the trainer's torch.distributed world (issue 40)
        (dict(vllm_mode="colocate"), "vllm_mode='colocate'.*trainer's torch.distributed world.*vllm_mode='server'"),
        (dict(async_correction="behaviour"), "async_correction='behaviour'.*vLLM's"),
        (dict(vllm_server_timeout=-1.0), "vllm_server_timeout=-1.0"),
    ],
)
def test_settings_that_do_not_combine_are_refused(tmp_path, overrides, match):
    values = dict(output_dir=str(tmp_path), async_rollouts=True, use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match=match):
        TRAPOConfig(**{**values, **overrides})
