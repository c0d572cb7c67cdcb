"""``make gpu-check``'s CPU dry run: the same checks at small sizes, one JSON verdict (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import pythonpath

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=pythonpath(), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.bench.gpu_check", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_the_cpu_dry_run_passes_every_check_it_can_and_says_why_it_skips_the_rest(tmp_path):
    out = tmp_path / "verdict.json"
    proc = _run("--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = json.loads(out.read_text())
    assert verdict["verdict"] == "passed" and verdict["mode"] == "cpu" and verdict["git_commit"]
    checks = {c["name"]: c for c in verdict["checks"]}
    assert list(checks) == ["environment", "memory_plan", "sft_step", "grpo_step", "tiny_grpo", "engine"]
    for name in ("environment", "memory_plan", "sft_step", "grpo_step", "tiny_grpo"):
        assert checks[name]["status"] == "passed", (name, checks[name]["reason"])
    assert checks["engine"]["status"] == "skipped" and "installed" in checks["engine"]["reason"]
    # the figures a user reads: F1 and F2 on the trainer itself, the paper configs' plans, throughput
    tiny = checks["tiny_grpo"]["details"]
    assert tiny["entries_moved"] > 0.9 and tiny["layer_passes"] == tiny["layer_passes_expected"]
    plans = checks["memory_plan"]["details"]["plans"]
    assert plans["data/train/grpo-qwen3-4b.yaml"]["fits_here"] and plans["data/train/sft-qwen3-4b.yaml"]["fits_here"]
    assert not plans["data/train/grpo-qwen3-4b-1gpu.yaml"]["fits_here"]  # it names an H200, this plan is an H100
    sft = checks["sft_step"]["details"]
    assert sft["activation_checkpointing"] and sft["tokens_per_s"] > 0 and sft["compute_dtype"] == "bfloat16"
    assert checks["grpo_step"]["details"]["train_tokens_per_s"] > 0
    assert checks["grpo_step"]["details"]["decode_s_per_step"] >= 0


def test_a_gpu_run_without_cuda_is_refused_with_the_way_out():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = _run("--only", "environment", timeout=120)
    assert proc.returncode == 2 and "--cpu" in proc.stderr and "no CUDA device" in proc.stderr


@pytest.mark.gpu
def test_the_gpu_check_passes_on_this_gpu(tmp_path):
    out = tmp_path / "verdict.json"
    proc = _run("--out", str(out), "--seconds", "20", timeout=900)
    verdict = json.loads(out.read_text())
    assert proc.returncode == 0 and verdict["verdict"] == "passed", verdict["failed"]
