"""A launched engine: its own GPUs, the run's context, a clean stop and a stable served path
(issue 29 items 5 and 6; audit F5, F8, F13).

The engine process here is real: a small probe server (written below into the test's folder) that
answers ``/health``, writes the environment and arguments it got to a file, and forks a grandchild
in its process group that outlives it on SIGTERM (as vLLM's engine core and SGLang's scheduler
outlive their API server), or the loopback stand-in engine (``train/generation/engine_server.py``) with the
tiny offline Qwen3. GPU memory is read through ``nvidia-smi``; where a test needs GPU memory that
is held and then released, a scripted ``nvidia-smi`` on ``PATH`` reports it (the only part that is
not the real thing: this machine has no GPU).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers.paths import pythonpath
from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.generation.engine import EngineError, EngineSampler, EngineSettings, make_api, parse_gpus
from hydroagent_hpc.train.generation.engine_process import (
    EngineProcess,
    EngineWeights,
    engine_cpus,
    engine_devices,
    group_members,
    trainer_processes,
    visible_devices,
)
from hydroagent_hpc.train.generation.engine_server import weights_digest
from hydroagent_hpc.train.generation.sampler import Sampling
from hydroagent_hpc.train.tiny import build_tiny

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")

PROBE = r'''
import argparse, json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GRANDCHILD = """
import signal, sys, time
linger = float(sys.argv[1])
def term(*_):
    time.sleep(linger)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--dump", required=True)
ap.add_argument("--linger", type=float, default=0.1)
args, _ = ap.parse_known_args()
# stderr not inherited: the engine log pipe closes with the server, so only the group wait can see the child
child = subprocess.Popen([sys.executable, "-c", GRANDCHILD, str(args.linger)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
assert child.stdout.readline().strip() == "ready"  # its SIGTERM handler is in place
with open(args.dump, "a") as f:
    time.sleep(0.2)  # the launcher pins this process right after it starts
    f.write(json.dumps({"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid(), "grandchild": child.pid,
                        "pgid": os.getpgid(0), "cpus": sorted(os.sched_getaffinity(0))}) + "\n")

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
ThreadingHTTPServer(("127.0.0.1", args.port), Health).serve_forever()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not: it holds no memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rfind(")") + 2] not in "ZXx"


@pytest.fixture
def probe(tmp_path):
    """``(settings_for(api, **kw), dumps())``: engine settings that launch the probe, and what it wrote."""
    script = tmp_path / "probe_engine.py"
    script.write_text(PROBE)
    dump = tmp_path / "probe.jsonl"

    def settings_for(api: str, *extra: str, linger: float = 0.1, **kw: object) -> EngineSettings:
        port = _free_port()
        launch = (sys.executable, str(script), "--port", str(port), "--dump", str(dump), "--linger", str(linger),
                  "--model", "{model}", *extra)
        return EngineSettings(api=api, url=f"http://127.0.0.1:{port}", launch=launch, start_timeout_s=30,
                              model_name="policy", **kw)  # type: ignore[arg-type]

    def dumps() -> list[dict]:
        return [json.loads(line) for line in dump.read_text().splitlines()] if dump.exists() else []

    return settings_for, dumps


@pytest.fixture
def trainer_env(monkeypatch):
    """Rank 0 of three trainers on a 4-GPU node, as torchrun / accelerate launch leave it."""
    for k, v in {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "6", "RANK": "0",
                 "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
                 "TORCHELASTIC_RUN_ID": "run-7"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)


def test_the_engines_gpus_are_the_visible_ones_no_trainer_uses():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,5,7"}) == ["2", "5", "7"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "4,-1,5"}) == ["4"]  # CUDA ignores what follows an invalid id
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-aa11,GPU-bb22"}) == ["GPU-aa11", "GPU-bb22"]
    assert trainer_processes({}) == 1
    assert trainer_processes({"WORLD_SIZE": "8"}) == 8
    assert trainer_processes({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}) == 4  # two nodes of four
    with pytest.raises(EngineError, match="LOCAL_WORLD_SIZE='x'"):
        trainer_processes({"LOCAL_WORLD_SIZE": "x"})
    assert engine_devices(None, 3, ["0", "1", "2", "3"]) == ["3"]
    assert engine_devices(None, 1, ["4", "6"]) == ["6"]  # entries, not positions
    assert engine_devices(("5",), 3, ["0", "1", "2", "3"]) == ["5"]
    assert engine_devices(None, 2, []) is None  # no CUDA device: nothing to choose
    with pytest.raises(EngineError, match=r"4 visible GPU\(s\) \(0,1,2,3\) and 4 trainer process\(es\).*\n  fix: "
                                          r"run 3 trainer\(s\).*engine\.gpus"):
        engine_devices(None, 4, ["0", "1", "2", "3"])
    assert parse_gpus([3]) == ("3",) and parse_gpus("2, 3") == ("2", "3") and parse_gpus(1) == ("1",)
    assert EngineSettings(api="sglang", url="http://h:1", gpus=[2, 3]).gpus == ("2", "3")
    for bad in ("x", [1, 1], [], [True], "1;2"):
        with pytest.raises(ConfigError, match=r"^engine\.gpus: .*(is not a list of GPU ids|no GPU or one GPU twice)"):
            EngineSettings(api="sglang", url="http://h:1", gpus=bad)


def test_a_launched_sglang_gets_its_own_gpu_the_runs_context_and_no_rendezvous(probe, trainer_env, tmp_path):
    """F5 + F13: the environment and arguments the engine process really got."""
    settings_for, dumps = probe
    settings = settings_for("sglang")
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log", context_tokens=34816)
    process.start(str(tmp_path / "weights"))
    try:
        got = dumps()[-1]
    finally:
        process.stop()
    env, argv = got["env"], got["argv"]
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # devices 0-2 are the three trainers'
    assert env["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"  # unscaled log-probs at any temperature
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID"):
        assert var not in env, var
    assert env["PATH"] == os.environ["PATH"]  # the rest of the trainer's environment
    assert argv[-2:] == ["--context-length", "34816"] and argv.count("--context-length") == 1
    assert argv[argv.index("--model") + 1] == str(tmp_path / "weights")
    assert process.api.unscaled_logprobs


def test_a_launched_vllm_keeps_a_given_context_and_takes_engine_gpus(probe, trainer_env, tmp_path, caplog):
    settings_for, dumps = probe
    settings = settings_for("vllm", "--max-model-len=4096", gpus=("1",))
    caplog.set_level(logging.WARNING)
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log", context_tokens=34816)
    assert "includes GPU(s) 1 that trainer processes use" in caplog.text  # asked for, so allowed: but said
    process.start(str(tmp_path / "weights"))
    process.stop()
    env, argv = dumps()[-1]["env"], dumps()[-1]["argv"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "SGLANG_RETURN_ORIGINAL_LOGPROB" not in env
    assert "--max-model-len=4096" in argv and "34816" not in argv  # the launch list's own value stands
    settings = settings_for("vllm")
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log", context_tokens=34816,
                            trainer_gpus=2)  # the trainer's count, given explicitly
    process.start(str(tmp_path / "weights"))
    process.stop()
    env, argv = dumps()[-1]["env"], dumps()[-1]["argv"]
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and argv[-2:] == ["--max-model-len", "34816"]


def test_no_gpu_left_for_the_engine_is_refused_before_anything_starts(probe, trainer_env, monkeypatch, tmp_path):
    settings_for, dumps = probe
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(EngineError, match=r"4 visible GPU\(s\) \(0,1,2,3\) and 4 trainer process\(es\) on this "
                                          r"node leave no GPU for the engine"):
        EngineWeights(settings_for("sglang"), tmp_path)
    assert dumps() == []


def test_on_a_machine_without_cuda_the_engine_inherits_the_environment(probe, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if visible_devices():
        pytest.skip("this machine has CUDA devices")
    settings_for, dumps = probe
    settings = settings_for("sglang")
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log")
    process.start(str(tmp_path / "weights"))
    process.stop()
    env, argv = dumps()[-1]["env"], dumps()[-1]["argv"]
    assert "CUDA_VISIBLE_DEVICES" not in env and "--context-length" not in argv  # no context given: none added


def test_stop_waits_until_the_servers_whole_process_group_is_gone(probe, tmp_path):
    """F8: the API server exits at once on SIGTERM, its grandchild (vLLM's engine core, holding the
    GPU) 1.5 s later; stop() returns only when no process of the group is left."""
    settings_for, dumps = probe
    settings = settings_for("vllm", linger=1.5)
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log", trainer_gpus=1)
    process.start(str(tmp_path / "weights"))
    got = dumps()[-1]
    assert got["pgid"] == got["pid"] and _alive(got["grandchild"])
    assert sorted(group_members(got["pgid"])) == sorted([got["pid"], got["grandchild"]])
    t0 = time.perf_counter()
    process.stop()
    waited = time.perf_counter() - t0
    assert not _alive(got["grandchild"]) and group_members(got["pgid"]) == []
    assert waited >= 1.0  # it waited for the grandchild, not only for the server
    process.start(str(tmp_path / "weights"))  # a restart after a clean stop
    assert process.running and len(dumps()) == 2
    process.stop()


def _fake_nvidia_smi(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A scripted ``nvidia-smi`` first on PATH, reading its answers from two files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gpus, apps = tmp_path / "gpus.csv", tmp_path / "apps.csv"
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncase "$*" in\n  *--query-gpu=*) cat "{gpus}" ;;\n'
                      f'  *--query-compute-apps=*) cat "{apps}" ;;\n  *) exit 1 ;;\nesac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return gpus, apps


def _report(gpus: Path, apps: Path, engine_mib: int, holders: list[int]) -> None:
    gpus.write_text(f"0, GPU-aaaa, NVIDIA H100 80GB HBM3, 61000\n1, GPU-bbbb, NVIDIA H100 80GB HBM3, {engine_mib}\n")
    apps.write_text("".join(f"{pid}, {engine_mib}\n" for pid in holders))


def test_a_restart_waits_until_the_old_engines_gpu_memory_is_released(probe, monkeypatch, tmp_path):
    """F5/F8: after the old server's processes are gone, the restart also waits (nvidia-smi) until
    no process of it holds GPU memory and the engine's GPU is back to its pre-start use; memory
    that stays taken is a clear error."""
    settings_for, dumps = probe
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpus, apps = _fake_nvidia_smi(tmp_path, monkeypatch)
    _report(gpus, apps, 400, [])  # before the first start: the engine's GPU 1 is empty
    settings = settings_for("vllm")
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log", trainer_gpus=1,
                            memory_timeout_s=10)
    assert process.devices == ["1"]
    process.start(str(tmp_path / "weights"))
    pid = dumps()[-1]["pid"]
    _report(gpus, apps, 70500, [pid])  # the server holds 70 GB of GPU 1
    released = threading.Timer(0.8, _report, args=(gpus, apps, 900, []))
    released.start()
    t0 = time.perf_counter()
    process.stop()
    assert time.perf_counter() - t0 >= 0.7  # it waited for the release
    released.join()
    process.start(str(tmp_path / "weights"))
    pid = dumps()[-1]["pid"]
    _report(gpus, apps, 70500, [pid])
    process.memory_timeout_s = 1.0
    with pytest.raises(EngineError, match=rf"GPU memory is not released after 1 s: processes \[{pid}\] of the old "
                                          r"server still hold GPU memory; GPU 1 uses 70500 MiB \(before the first "
                                          r"start: 400 MiB\)\n  fix: check nvidia-smi"):
        process.stop()
    assert not process.running


def test_vllm_is_restarted_on_one_stable_path(probe, tmp_path):
    """F8: each restart serves the same folder path (``weights_dir/current``, swapped to the newest
    step), so vLLM's compile-cache key, whose first factor is the model path, does not change."""
    settings_for, dumps = probe
    model, tok = build_tiny(seed=0)
    with EngineWeights(settings_for("vllm"), tmp_path, context_tokens=2048, trainer_gpus=1) as weights:
        weights.push(model, tok, 0)
        weights.push(model, tok, 1)
        assert weights.process is not None and weights.process.starts == 2
    served = [d["argv"][d["argv"].index("--model") + 1] for d in dumps()]
    current = tmp_path.resolve() / "engine-weights" / "current"
    assert served == [str(current), str(current)]
    assert os.path.realpath(current) == str(tmp_path.resolve() / "engine-weights" / "step-000001")
    assert sorted(p.name for p in (tmp_path / "engine-weights").iterdir()) == ["current", "step-000001"]
    assert all(d["argv"][-2:] == ["--max-model-len", "2048"] for d in dumps())


def test_a_launched_sglang_stand_in_returns_unscaled_logprobs_within_the_runs_context(tmp_path, monkeypatch,
                                                                                      caplog):
    """F13 end to end: the launched stand-in (SGLang semantics) got SGLANG_RETURN_ORIGINAL_LOGPROB=1
    and --context-length from the launcher, so its log-probs at T = 0.7 are the trainer's own and no
    warning is logged; a turn beyond the context is refused; weights are reloaded live."""
    monkeypatch.setenv("PYTHONPATH", pythonpath())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    caplog.set_level(logging.WARNING)
    model, tok = build_tiny(seed=0)
    stop = HFLocalPolicy(model, tok).stop_ids
    port = _free_port()
    settings = EngineSettings(api="sglang", url=f"http://127.0.0.1:{port}", start_timeout_s=180,
                              launch=(sys.executable, "-m", "hydroagent_hpc.train.generation.engine_server",
                                      "--model", "{model}",
                                      "--port", str(port), "--device", "cpu"))
    prompt = tok("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    with EngineWeights(settings, tmp_path, context_tokens=len(prompt) + 16, trainer_gpus=1) as weights:
        weights.push(model, tok, 0)
        info = weights.api._request("GET", "/engine_info")
        assert info["original_logprob"] is True and info["context_tokens"] == len(prompt) + 16
        assert info["model_path"] == str(weights.served_path) and info["device"] == "cpu"
        row = EngineSampler(weights.api, stop, Sampling(temperature=0.7, max_new_tokens=12)).sample([prompt], [7])[0]
        seq = torch.tensor([prompt + row.ids])
        with torch.no_grad():
            own = torch.log_softmax(model(seq).logits[0, len(prompt) - 1:-1].float(), -1)
        own = own.gather(-1, torch.tensor(row.ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(row.logprobs), own, atol=1e-5)
        with pytest.raises(EngineError, match="HTTP 400: .*maximum context length"):
            EngineSampler(weights.api, stop, Sampling(max_new_tokens=16)).sample([prompt], [1])
        other = build_tiny(seed=1)[0]
        weights.push(other, tok, 1)  # SGLang reloads live: no second start
        assert weights.process is not None and weights.process.starts == 1
        info = weights.api._request("GET", "/engine_info")
        assert info["weights_sha256"] == weights_digest(other) and info["updates"] == 1
        assert os.path.realpath(weights.served_path).endswith("step-000001")
    assert "softmax(logits" not in caplog.text


def test_a_launched_engine_runs_on_the_cpus_the_job_set_aside_for_it(probe, monkeypatch, tmp_path):
    """slurm/ranks.sh gives rank 0 its own CPUs plus the engine's (HYDROAGENT_ENGINE_CPUS): the engine
    runs on the latter with as many threads, not on the trainer's with its OMP_NUM_THREADS (gpu-audit F10)."""
    mine = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("HYDROAGENT_ENGINE_CPUS", str(mine[-1]))
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    settings_for, dumps = probe
    settings = settings_for("sglang")
    process = EngineProcess(settings, make_api(settings), tmp_path / "engine.log")
    process.start(str(tmp_path / "weights"))
    process.stop()
    got = dumps()[-1]
    assert got["cpus"] == [mine[-1]] and got["env"]["OMP_NUM_THREADS"] == "1"
    assert engine_cpus({"HYDROAGENT_ENGINE_CPUS": "8-10,12"}) == {8, 9, 10, 12} and engine_cpus({}) == set()
    with pytest.raises(EngineError, match="HYDROAGENT_ENGINE_CPUS='x'"):
        engine_cpus({"HYDROAGENT_ENGINE_CPUS": "x"})
