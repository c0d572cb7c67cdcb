"""The GRPO config: strict YAML with file:line errors, preset defaults, resolved paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.grpo.config import PRESET_DEFAULTS, load_grpo_config


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "grpo.yaml"
    p.write_text(text)
    return p


def test_preset_defaults_fill_only_the_keys_not_given(tmp_path):
    paper = load_grpo_config(_write(tmp_path, "basins: [b1, b2]\n"))
    assert (paper.group_size, paper.kl_coef, paper.advantage) == (8, 0.2, "episode")
    assert paper.lr == 1e-6 and paper.entropy_coef == 0.01 and (paper.temperature, paper.top_p) == (1.0, 0.95)
    assert paper.max_simulations_in_flight == 32
    assert paper.basins == (str((tmp_path / "b1").resolve()), str((tmp_path / "b2").resolve()))
    released = load_grpo_config(_write(tmp_path, "preset: released\nbasins: [b1]\nkl_coef: 0.1\n"))
    assert released.group_size == PRESET_DEFAULTS["released"]["group_size"] == 6
    assert released.advantage == "released" and released.kl_coef == 0.1


@pytest.mark.parametrize("text, line, words", [
    ("basins: [b]\ngroup_sise: 4\n", 2, "unknown key"),
    ("basins: [b]\nlr: 1e-6\n", 2, "expected a number"),
    ("basins: [b]\n\nadvantage: gae\n", 3, "not one of"),
    ("basins: [b]\ntop_p: 1.5\n", 2, "at most 1"),
    ("basins: [b]\ngroup_size: 0\n", 2, "at least 1"),
    ("basins: [a, b]\nvalidation_basins: [b]\n", 2, "also training basins"),
    ("basins: [b]\naggregation: seq-mean-token-sum-norm\n", 2, "norm_length"),
    ("basins: [b]\nenv: {max_turnz: 3}\n", 2, "env"),
    ("preset: paper\n", 1, "basins"),
])
def test_bad_configs_name_the_file_line_and_key(tmp_path, text, line, words):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_grpo_config(path)
    message = str(err.value)
    assert words in message
    assert f"{path}:{line}" in message or (line == 1 and str(path) in message)


@pytest.mark.parametrize("name", ["grpo-tiny.yaml", "grpo-qwen3-4b.yaml", "grpo-released.yaml"])
def test_the_shipped_configs_load_and_hold_their_recipes(name):
    root = Path(__file__).resolve().parents[1] / "data" / "train"
    c = load_grpo_config(root / name)
    assert all(b.startswith(str(root.parents[1])) for b in c.basins)
    assert not set(c.basins) & set(c.validation_basins)
    if name == "grpo-qwen3-4b.yaml":  # the paper (docs/reference-implementation.md section 7)
        assert (c.group_size, c.kl_coef, c.entropy_coef, c.lr, c.prompts_per_step) == (8, 0.2, 0.01, 1e-6, 4)
        assert (c.temperature, c.top_p, c.advantage, c.preset) == (1.0, 0.95, "episode", "paper")
        assert c.max_simulations_in_flight == 32 and c.env["max_turns"] == 50 and len(c.basins) == 10
    if name == "grpo-released.yaml":
        assert (c.group_size, c.kl_coef, c.advantage, c.preset) == (6, 0.05, "released", "released")


def test_a_run_started_before_a_key_existed_resumes_while_the_key_holds_its_default(tmp_path):
    """config.yaml written by an older version lacks the newer keys (generator, engine, fsdp, ...):
    resuming with those at their defaults is the same run; changing one is refused, naming it."""
    import yaml

    from hydroagent_hpc.train.grpo.config import GRPOConfig
    from hydroagent_hpc.train.rundir import field_defaults, prepare_run_dir, write_run_config

    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("basins: [a]\n")
    config = load_grpo_config(cfg).to_dict()
    run = tmp_path / "run"
    write_run_config(run, config, {})
    doc = yaml.safe_load((run / "config.yaml").read_text())
    for key in ("generator", "engine", "fsdp", "activation_checkpointing"):
        del doc["config"][key]  # as an older version wrote it
    (run / "config.yaml").write_text(yaml.safe_dump(doc))
    import torch

    from hydroagent_hpc.train.checkpoint import TrainerState, save_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(run, model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                    TrainerState(step=3))  # its manifest records the config as the older version wrote it
    defaults = field_defaults(GRPOConfig)
    assert prepare_run_dir(run, config, True, ConfigError, defaults) == run / "checkpoints" / "step-3"
    with pytest.raises(ConfigError, match="differs in fsdp"):
        prepare_run_dir(run, {**config, "fsdp": True}, True, ConfigError, defaults)
    with pytest.raises(ConfigError, match="differs in activation_checkpointing, fsdp, generator"):
        prepare_run_dir(run, config, True, ConfigError)  # without the defaults: every new key differs


def test_engine_gpus_are_checked_with_the_config_naming_file_and_line(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("basins: [a]\ngenerator: engine\nengine: {api: sglang, url: 'http://127.0.0.1:1', gpus: 'x y'}\n")
    with pytest.raises(ConfigError, match=r"grpo.yaml:3: engine.gpus: 'x y' is not a list of GPU ids"):
        load_grpo_config(path)
    path.write_text("basins: [a]\ngenerator: engine\nengine: {api: sglang, url: 'http://127.0.0.1:1', gpus: [3]}\n")
    assert load_grpo_config(path).engine.gpus == ("3",)


def test_the_entry_points_options_are_the_configs_keys(tmp_path, monkeypatch):
    from hydroagent_hpc.settings import arguments_given
    from hydroagent_hpc.train.grpo.launch import CONFIG_OPTIONS, build_parser

    cfg = _write(tmp_path, "basins: [b1]\ngroup_size: 4\n")
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args([str(cfg), "--out", "r", "--group-size", "2", "--preset", "released",
                                      "--basins", "x", "--basins", "y", "--no-share-runs"])
    config = load_grpo_config(cfg, overrides=arguments_given(args, CONFIG_OPTIONS))
    assert (config.group_size, config.preset, config.share_runs) == (2, "released", False)
    assert config.advantage == PRESET_DEFAULTS["released"]["advantage"]  # the preset given on the command line
    assert config.basins == (str(tmp_path / "x"), str(tmp_path / "y"))
    with pytest.raises(SystemExit):
        build_parser().parse_args([str(cfg), "--out", "r", "--top-p", "1.5"])
    with pytest.raises(ConfigError, match=r"command line \(--validation-basins\).*also training basins"):
        load_grpo_config(cfg, overrides={"validation_basins": ("b1",)})
    help_text = " ".join(build_parser().format_help().split())
    assert "--kl-coef" in help_text and "--env" not in help_text and "--engine " not in help_text
