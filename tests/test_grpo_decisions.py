"""``pg_tokens: arguments``: the policy gradient on the tool calls' arguments only (train/grpo/decisions.py).

The mask is checked on the tiny offline Qwen3's real tokenizer (byte-level BPE, ``<tool_call>`` one
special id); the trainer's use of it in :func:`~hydroagent_hpc.train.grpo.trainer.optimise` is
checked against the GRPO objective written out by hand in ``tests/test_grpo_breaks.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.generation.rollout import Rollout, RolloutSpec
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping
from hydroagent_hpc.train.grpo.decisions import PieceTable, argument_mask
from hydroagent_hpc.train.grpo.trainer import Ranks, _shared_batch, learning_signal
from hydroagent_hpc.train.tiny import build_tiny_tokenizer

SET = ('Peak too low: overland routing (alpha0).\n<tool_call>\n'
       '{"name": "set_parameters", "arguments": {"alpha0": 0.911, "wm": 1.2}}\n</tool_call>')
RUN = 'Running the model.\n<tool_call>\n{"name": "run_simulation", "arguments": {}}\n</tool_call>'
PROSE = 'I stop here: the "arguments": key is not a call.'
CUT = 'Cut short.\n<tool_call>\n{"name": "set_parameters", "arguments": {"b": 0.3'


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _episode(tok, turns: list[str]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """A sequence: a prompt, then each assistant turn (sampled, mask 1) followed by a tool response that
    itself quotes a call (never trained: mask 0)."""
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = enc('<|im_start|>user\nCalibrate. Example: <tool_call>{"arguments": {"b": 9}}</tool_call><|im_end|>\n')
    mask, spans = [0] * len(ids), []
    for text in turns:
        turn = enc(text) + enc("<|im_end|>")
        spans.append((len(ids), len(ids) + len(turn)))
        ids, mask = ids + turn, mask + [1] * len(turn)
        echo = enc('<tool_response>\n{"arguments": {"wm": 5}}\n</tool_response>\n')
        ids, mask = ids + echo, mask + [0] * len(echo)
    return ids, mask, spans


def _masked_text(tok, ids, mask, span) -> str:
    return "".join(p for p, m in zip(PieceTable(tok)(ids[slice(*span)]), mask[slice(*span)]) if m)


def test_the_mask_covers_each_calls_arguments_and_nothing_else(tok):
    """On each assistant turn, exactly the tokens of the call's arguments (from after ``"arguments":`` to
    ``</tool_call>``, or the turn's end for a call cut short); none in the prose, the call's name, a
    ``"arguments":`` in prose, or the prompt's and tool responses' quoted calls."""
    ids, _, spans = _episode(tok, [SET, RUN, PROSE, CUT])
    mask = argument_mask(PieceTable(tok)(ids), spans)
    assert mask.dtype == np.float32 and mask.shape == (len(ids),)
    texts = [_masked_text(tok, ids, mask, span) for span in spans]
    assert texts[0] == ' {"alpha0": 0.911, "wm": 1.2}}\n'
    assert texts[1] == " {}}\n"
    assert texts[2] == ""
    assert texts[3].strip().startswith("{") and texts[3].endswith("0.3<|im_end|>")  # a cut call: to the turn's end
    inside = np.zeros(len(ids), dtype=bool)
    for s, e in spans:
        inside[s:e] = True
    assert not mask[~inside].any()  # the prompt and the tool responses: never


def test_the_training_batch_carries_the_mask_only_when_asked_and_the_signal_counts_it(tok):
    """``pg_tokens: arguments`` reaches the batch the trainer optimises (:func:`_shared_batch`, the step's
    path): each sequence's token advantages are its turn's on the argument tokens and 0 elsewhere; with
    ``all`` every sampled token carries them. The per-step signal counts the zeroed tokens."""
    ids, mask, spans = _episode(tok, [SET, RUN])
    rollout = Rollout(RolloutSpec(0, 0, "b", 0, "e"), None, ids, mask, spans, [0.1, 0.2], 1.0)
    per_turn = {0: np.array([2.0, -1.0])}
    played = SimpleNamespace(rollouts=[rollout], per_turn=per_turn)

    def batch(pg_tokens: str):
        config = grpo_config_from_mapping({"basins": ["unused"], "pg_tokens": pg_tokens})
        ranks = Ranks.one_process(torch.nn.Linear(1, 1))
        run = SimpleNamespace(config=config, tokenizer=tok, ranks=ranks, generator=None)
        return _shared_batch(run, played)

    (seq_all,), (seq_args,) = batch("all"), batch("arguments")
    assert seq_all.pg_mask is None
    adv_all, adv_args = seq_all.token_advantages(), seq_args.token_advantages()
    m = np.asarray(mask, dtype=bool)
    assert set(adv_all[m]) == {2.0, -1.0}
    args = argument_mask(PieceTable(tok)(ids), spans).astype(bool)
    np.testing.assert_array_equal(adv_args[args], adv_all[args])
    assert not adv_args[~args].any() and args.sum() < m.sum() / 3
    signal_all = learning_signal([seq_all], np.array([2.0, -1.0]), 0, 1)
    signal_args = learning_signal([seq_args], np.array([2.0, -1.0]), 0, 1)
    assert signal_all["tokens_adv_zero"] == 0
    assert signal_args["tokens_adv_zero"] == pytest.approx(1 - args.sum() / m.sum())


def test_an_unknown_choice_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="pg_tokens"):
        grpo_config_from_mapping({"basins": ["unused"], "pg_tokens": "digits"})
