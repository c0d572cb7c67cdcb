"""A NaN or infinite loss, gradient or weight stops a run; the last checkpoint stays and no non-finite
``final/`` is written (issue 32, item 4).

Real parts: the tiny offline Qwen3 saved as a ``save_pretrained`` folder, real SFT data files, the real
``hydroagent train sft|grpo`` commands in this process and the trainers' own functions. The non-finite
numbers come from the weights, not from a patched function:

- a base model with a NaN weight is refused when it loads, before the run folder exists (SFT and GRPO);
- a base model whose input embedding of one token is 3e38 (finite: it loads) gives a finite loss but a
  NaN gradient on every sequence holding that token and normal numbers on the others. SFT on two
  examples, the one with the token trained at step 2, saves step 1 and must stop at step 2 with
  ``latest`` still naming step 1, that checkpoint unchanged and finite, and no ``final/``; GRPO's
  ``optimise`` on a sequence with the token must stop before its optimizer step with the weights as
  they were;
- ``final/`` of either trainer is never written from non-finite weights.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from hydroagent_hpc.cli import main  # noqa: E402
from hydroagent_hpc.train.tiny import build_tiny  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HUGE = 3e38  # finite in fp32; its square is not


def _untied(seed: int = 0):
    """The tiny model and tokenizer with its output layer a copy of (not tied to) the input embedding, so
    an input embedding row touches only the sequences that hold its token."""
    model, tok = build_tiny(seed=seed)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    return model, tok


def _save(model, tok, folder: Path) -> Path:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory) -> Path:
    model, tok = _untied()
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[3, 7] = float("nan")
    return _save(model, tok, tmp_path_factory.mktemp("nan-model") / "model")


@pytest.fixture(scope="module")
def two_examples(tmp_path_factory):
    """Two short conversations and a token that only the one trained second holds (early in it)."""
    from hydroagent_hpc.train.sft.trainer import plan_epoch

    _, tok = build_tiny(seed=0)
    trajs = short_trajectories(tok, 2, seed=5)
    order = [b[0] for b in plan_epoch([len(t) for t in trajs], 1, 0, 0, False)]
    first, second = trajs[order[0]], trajs[order[1]]
    token = next(int(t) for t in second.input_ids if int(t) not in {int(x) for x in first.input_ids})
    data = write_sft_data(tmp_path_factory.mktemp("two") / "data.h5", trajs, [1.0, 1.0])
    return data, token


def _poisoned(folder: Path, token: int) -> Path:
    model, tok = _untied()
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = HUGE
    return _save(model, tok, folder)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def _errors(err: str) -> list[str]:
    """The error lines (transformers draws its loading bars on stderr too)."""
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_the_poisoned_token_gives_a_nan_gradient_and_only_there(two_examples, tmp_path):
    """The premise of the SFT test below, checked directly: a finite loss with a NaN gradient on a
    sequence with the token, finite numbers without it."""
    _, token = two_examples
    model, _ = _untied()
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = HUGE
    norms = []
    for ids in ([1, 2, 3, token, 4, 5, 6], [1, 2, 3, 4, 5, 6]):
        model.zero_grad()
        t = torch.tensor([ids])
        out = model(input_ids=t, labels=t)
        out.loss.backward()
        assert np.isfinite(float(out.loss.detach()))
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
    assert np.isnan(norms[0]) and np.isfinite(norms[1]), norms


# --------------------------------------------------------------------------------------------- SFT
def _sft_config(path: Path, data: Path, model: Path | str, **extra: object) -> Path:
    values = {"data": data, "model": model, "lr": "1.0e-3", "max_steps": 2, "micro_batch_size": 1, "grad_accum": 1,
              "save_every": 1, "keep_checkpoints": 5, "bucket_by_length": "false", "seed": 0, **extra}
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def test_sft_refuses_a_base_model_with_nan_weights_before_the_run_folder(nan_model, two_examples, tmp_path, capsys):
    data, _ = two_examples
    cfg = _sft_config(tmp_path / "sft.yaml", data, nan_model)
    rc, err = _run(["train", "sft", str(cfg), "--out", str(tmp_path / "run")], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert len(_errors(err)) == 1, err
    assert str(nan_model) in err and "model.layers.0.mlp.up_proj.weight" in err and "NaN" in err, err
    assert not (tmp_path / "run").exists()


def test_sft_stops_at_a_nan_gradient_and_keeps_the_last_checkpoint(two_examples, tmp_path, capsys):
    data, token = two_examples
    base = _poisoned(tmp_path / "base", token)
    cfg = _sft_config(tmp_path / "sft.yaml", data, base)
    run = tmp_path / "run"
    rc, err = _run(["train", "sft", str(cfg), "--out", str(run)], capsys)
    assert rc == 1 and "Traceback" not in err, err
    line = _errors(err)
    assert len(line) == 1 and re.search(r"step 2: the gradient norm is nan", line[0]), err
    assert "step-1" in line[0] and "intact" in line[0] and "no final/" in line[0], err
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-1"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-")) == ["step-1"]
    state = torch.load(ckpts / "step-1" / "model.pt", map_location="cpu", weights_only=True)
    assert all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())
    assert not (run / "final").exists() and not (run / "final.tmp").exists()
    rows = (run / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1"], rows


def test_sft_final_is_never_written_from_nonfinite_weights(tmp_path):
    from hydroagent_hpc.train.finite import NonFiniteError
    from hydroagent_hpc.train.sft.trainer import _save_final

    model, tok = build_tiny(seed=0)
    with torch.no_grad():
        model.model.norm.weight[0] = float("inf")
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "marker").write_text("earlier")
    with pytest.raises(NonFiniteError, match=r"model\.norm\.weight holds NaN or infinite"):
        _save_final(tmp_path / "final", model, tok, torch.float32)
    assert (tmp_path / "final" / "marker").read_text() == "earlier" and not (tmp_path / "final.tmp").exists()


# --------------------------------------------------------------------------------------------- GRPO
def test_grpo_refuses_a_base_model_with_nan_weights_before_the_run_folder(nan_model, grpo_basins, tmp_path, capsys):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(f"basins: [{grpo_basins / 'b1'}]\nmodel: {nan_model}\ngroup_size: 2\nprompts_per_step: 1\n"
                   f"max_steps: 1\nmax_new_tokens: 8\n")
    rc, err = _run(["train", "grpo", str(cfg), "--out", str(tmp_path / "run")], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert len(_errors(err)) == 1, err
    assert str(nan_model) in err and "model.layers.0.mlp.up_proj.weight" in err, err
    assert not (tmp_path / "run").exists()


def _grpo_batch(token: int):
    from hydroagent_hpc.train.grpo.trainer import _Sequence

    ids = [5, 6, token, 8, 9, 10, 11, 12, 13, 14]
    mask = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    return [_Sequence(ids, mask, [(4, 10)], [], np.array([1.0]))]


def test_grpo_stops_before_the_optimizer_step_on_a_nan_gradient(two_examples):
    from hydroagent_hpc.train.finite import NonFiniteError
    from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping
    from hydroagent_hpc.train.grpo.trainer import Ranks, optimise

    _, token = two_examples
    model, _ = _untied()
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = HUGE
    model.train()
    before = copy.deepcopy(model.state_dict())
    config = grpo_config_from_mapping({"basins": ["/nonexistent/b"], "kl_coef": 0.0, "lr": 1e-3})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(NonFiniteError, match=r"step 7: the gradient norm is nan; the run stopped before the "
                                             r"optimizer step"):
        optimise(config, model, optimizer, _grpo_batch(token), 0, Ranks.one_process(model), 7)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the weights moved on a NaN gradient"
    assert not optimizer.state, "the optimizer stepped"
    # the same batch without the token trains
    clean = _untied()[0].train()
    parts = optimise(config, clean, torch.optim.AdamW(clean.parameters(), lr=1e-3), _grpo_batch(7), 0,
                     Ranks.one_process(clean), 7)
    assert np.isfinite(parts["grad_norm"]) and parts["grad_norm"] > 0


def test_grpo_final_is_never_written_from_nonfinite_weights(tmp_path):
    from hydroagent_hpc.train.finite import NonFiniteError
    from hydroagent_hpc.train.grpo.trainer import _save_final

    model, tok = build_tiny(seed=0)
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"q_proj\.weight holds NaN"):
        _save_final(tmp_path / "final", model, tok)
    assert not (tmp_path / "final").exists() and not (tmp_path / "final.tmp").exists()


def test_weights_check_names_the_tensor_and_passes_finite_models():
    from hydroagent_hpc.train.finite import check_weights, first_nonfinite

    model, _ = build_tiny(seed=0)
    assert first_nonfinite(model.named_parameters()) is None
    check_weights(model, "ok")
    with torch.no_grad():
        model.model.layers[0].input_layernorm.weight[1] = -float("inf")
    assert first_nonfinite(model.named_parameters()) == "model.layers.0.input_layernorm.weight"
