"""The GPU first-contact failures of the trainers (``../shared/docs/gpu-audit/README.md``), seen on CPU.

Each test runs the real trainer code under the condition that only a GPU would otherwise create
(bf16 compute, a rollout phase before the update, several visible devices at save time) and fails on
the code the audit read:

- F1: bf16 training keeps fp32 master weights, so an AdamW step at the paper's lr 1e-6 moves them;
- F2: the update runs in training mode with activation checkpointing recomputing every layer,
  whatever the rollout phase left;
- F12: CUDA RNG states are saved and restored per rank and per device;
- F13: the loss is computed in float32, never float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hydroagent_hpc.train.checkpoint import cuda_state_for, rank_rng_state
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping
from hydroagent_hpc.train.grpo.loss import LogprobModel
from hydroagent_hpc.train.grpo.trainer import (
    Ranks,
    _accumulate,
    _Sequence,
    enable_checkpointing,
    optimise,
    play_episodes,
    train_grpo,
    training_batch,
)
from hydroagent_hpc.train.tiny import build_tiny


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


def _batch(seed: int = 3) -> list[_Sequence]:
    """Three sequences with assistant spans and non-zero advantages."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (14, 9, 21):
        ids = rng.integers(5, 200, size=n).tolist()
        spans = [(3, n - 2)]
        mask = [0] * n
        mask[3:n - 2] = [1] * (n - 5)
        out.append(_Sequence(ids, mask, spans, [], rng.normal(size=1)))
    return out


# ---------------------------------------------------------------------------------------------
# F1: weights that move


def test_bf16_training_moves_nearly_every_weight_at_the_papers_learning_rate(basins, tmp_path):
    """One GRPO step of the whole trainer with ``dtype: bf16`` (what ``auto`` means on a GPU) at
    lr 1e-6 changes more than 90 % of the policy's entries. With bf16 master weights about 2 % move
    (gpu-audit probe_bf16_adamw.py): an Adam step of ~1e-6 is below bf16's spacing."""
    d = str(basins / "b1")
    config = grpo_config_from_mapping({"basins": [d], "group_size": 2, "prompts_per_step": 1, "max_steps": 1,
                                       "max_new_tokens": 8, "generation_batch": 2, "env": {"max_turns": 1},
                                       "lr": 1e-6, "dtype": "bf16", "seed": 0})
    summary = train_grpo(config, tmp_path / "run")
    assert summary["steps"] == 1
    from safetensors.torch import load_file

    after = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    before = build_tiny(seed=0)[0].state_dict()
    # compared in the saved dtype: a bf16 policy's entries differ from the fp32 initial ones by rounding alone
    changed = sum(int((after[k] != before[k].to(after[k].dtype)).sum()) for k in after)
    total = sum(t.numel() for t in after.values())
    assert changed / total > 0.9, f"only {changed / total:.1%} of the entries moved"
    # the policy trains and is saved in fp32: the master weights, not a bf16 rounding of them
    assert {str(t.dtype) for t in after.values()} == {"torch.float32"}
    # and no more than an lr-sized step each (Adam's first step is about lr per entry)
    worst = max(float((after[k].float() - before[k].float()).abs().max()) for k in after)
    assert worst < 1e-5


def test_bf16_compute_keeps_fp32_parameters_and_gradients():
    """The autocast path (one process or DDP) computes in bf16 over fp32 parameters: the gradients
    DDP all-reduces are fp32 (gpu-audit F13), and the forward really ran in bf16."""
    model, _ = build_tiny(seed=0)
    model.train()
    ranks = Ranks.one_process(model, dtype=torch.bfloat16)
    assert ranks.autocast_dtype is torch.bfloat16
    seen: set[torch.dtype] = set()
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
    config = grpo_config_from_mapping({"basins": ["x"], "kl_coef": 0.0})
    batch = _batch()
    _accumulate(config, ranks.scorer, None, batch, list(range(len(batch))), float(sum(sum(s.mask) for s in batch)),
                float(len(batch)), 1, torch.device("cpu"), autocast_dtype=ranks.autocast_dtype)
    hook.remove()
    assert seen == {torch.bfloat16}
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert all(p.dtype == torch.float32 for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# F2: training mode and activation checkpointing inside every update


def test_the_update_after_a_rollout_phase_recomputes_every_checkpointed_layer(basins):
    """A hook counts decoder-layer forward calls during the update that follows real rollouts
    (``play_episodes``): with checkpointing each layer runs twice per pass (forward, then recomputed in
    backward). The audit found the policy left in eval mode by ``play_episodes``, so no layer recomputed and
    a long episode kept every layer's activations."""
    from hydroagent_hpc.sim import open_simulator
    from hydroagent_hpc.sim.basin import load_basin
    from hydroagent_hpc.train.generation.rollout import RolloutSpec

    d = str(basins / "b1")
    config = grpo_config_from_mapping({"basins": [d], "group_size": 2, "max_new_tokens": 8, "generation_batch": 2,
                                       "env": {"max_turns": 1}, "kl_coef": 0.0, "activation_checkpointing": True})
    model, tok = build_tiny(seed=0)
    enable_checkpointing(model)
    model.train()
    specs = [RolloutSpec(0, k, d, k, f"ac{k}") for k in range(2)]
    rollouts, _ = play_episodes(config, model, tok, specs, {d: open_simulator(f"{d}/control.txt")}, {d: load_basin(d)})
    assert model.training, "the rollout phase must give the policy back in the mode it found it in"
    model.eval()  # even a policy someone left in eval mode trains with checkpointing
    calls = [0]
    layers = list(model.model.layers)
    # on each layer's MLP: transformers recomputes a layer by calling its ``forward`` (not ``__call__``),
    # so a hook on the layer itself would not see the recomputation; its submodules are called as usual
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
             for layer in layers]
    batch = training_batch(rollouts, {i: np.array([1.0 if i == 0 else -1.0] * len(r.spans))
                                       for i, r in enumerate(rollouts)})
    parts = optimise(config, model, torch.optim.AdamW(model.parameters(), lr=1e-6), batch, 0,
                      Ranks.one_process(model))
    for h in hooks:
        h.remove()
    assert parts["tokens"] > 0
    assert calls[0] == 2 * len(layers) * len(batch), (calls[0], len(layers), len(batch))


def test_a_scorer_in_eval_mode_is_refused_inside_an_update():
    model, _ = build_tiny(seed=0)
    scorer = LogprobModel(model).eval()
    config = grpo_config_from_mapping({"basins": ["x"], "kl_coef": 0.0})
    with pytest.raises(RuntimeError, match="eval mode"):
        _accumulate(config, scorer, None, _batch(), [0], 10.0, 1.0, 1, torch.device("cpu"))


# ---------------------------------------------------------------------------------------------
# F13: the loss in float32


def test_no_float64_tensor_is_saved_for_the_backward_pass():
    """Advantages arrive as float64 numpy arrays; the loss must not promote the step to float64
    (on a GPU that is slow element-wise work over every token of every episode)."""
    model, _ = build_tiny(seed=0)
    model.train()
    ranks = Ranks.one_process(model, reference=build_tiny(seed=0)[0])
    config = grpo_config_from_mapping({"basins": ["x"], "kl_coef": 0.2})
    batch = _batch()
    assert batch[0].advantages.dtype == np.float64
    saved: set[torch.dtype] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.add(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _accumulate(config, ranks.scorer, ranks.reference, batch, [0, 1, 2],
                    float(sum(sum(s.mask) for s in batch)), 3.0, 1, torch.device("cpu"))
    assert torch.float32 in saved and torch.float64 not in saved, saved


# ---------------------------------------------------------------------------------------------
# F12: resume with another number of visible devices


def test_a_checkpoint_from_four_visible_devices_restores_on_one():
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]  # old format: every visible device
    assert torch.equal(cuda_state_for(states, 0), states[0])
    assert torch.equal(cuda_state_for(states, 2), states[2])
    assert torch.equal(cuda_state_for(states[:1], 3), states[0])  # fewer saved than this device's index
    assert torch.equal(cuda_state_for(states[3], 0), states[3])  # new format: this rank's own device
    assert cuda_state_for(None, 0) is None and cuda_state_for([], 0) is None


def test_each_rank_restores_its_own_rng_states_and_a_new_rank_takes_rank_zeros():
    extra = {"rng": {"who": 0}, "rng_ranks": [{"who": 0}, {"who": 1}]}
    assert rank_rng_state(extra, 1) == {"who": 1}
    assert rank_rng_state(extra, 0) == {"who": 0}
    assert rank_rng_state(extra, 3) == {"who": 0}  # resumed with more ranks than saved
    assert rank_rng_state({"rng": {"who": 0}}, 1) == {"who": 0}  # a checkpoint from before per-rank states


@pytest.mark.gpu
def test_cuda_rng_of_a_four_device_checkpoint_restores_on_this_device():
    from hydroagent_hpc.train.checkpoint import rng_state, set_rng_state

    state = rng_state()
    assert isinstance(state["cuda"], torch.Tensor)  # one device's state, not a list of all
    state["cuda"] = [torch.cuda.get_rng_state()] * 4  # as written by the old code on a 4-GPU node
    set_rng_state(state)
    a = torch.rand(4, device="cuda")
    set_rng_state(state)
    assert torch.equal(a, torch.rand(4, device="cuda"))


def test_local_generation_computes_in_the_trainers_dtype_over_fp32_weights(basins):
    """With fp32 master weights the in-process sampler must not decode in fp32 on a GPU (twice the KV
    cache and the weight reads the memory plan counts): it runs under autocast to the compute dtype."""
    from hydroagent_hpc.sim import open_simulator
    from hydroagent_hpc.sim.basin import load_basin
    from hydroagent_hpc.train.generation.rollout import RolloutSpec

    d = str(basins / "b1")
    config = grpo_config_from_mapping({"basins": [d], "group_size": 1, "max_new_tokens": 4, "generation_batch": 1,
                                       "env": {"max_turns": 1}, "dtype": "bf16"})
    model, tok = build_tiny(seed=0)
    seen: set[torch.dtype] = set()
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
    play_episodes(config, model, tok, [RolloutSpec(0, 0, d, 0, "gen0")], {d: open_simulator(f"{d}/control.txt")},
          {d: load_basin(d)})
    hook.remove()
    assert seen == {torch.bfloat16} and all(p.dtype == torch.float32 for p in model.parameters())
