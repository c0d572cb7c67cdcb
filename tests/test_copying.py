"""Copy pretraining (train/copying.py): documents whose answers quote their reply exactly, a loss on
the answers only, a run that lowers it, determinism for a seed, and the bench's Base unit using it."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from hydroagent_hpc.train.copying import COPY_KEYS, _batch, copy_accuracy, copy_document, pretrain_copy
from hydroagent_hpc.train.tiny import build_tiny


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


def test_a_document_quotes_values_of_its_reply_exactly():
    rng = np.random.default_rng(0)
    for _ in range(200):
        prompt, answer = copy_document(rng)
        reply = json.loads(re.search(r"<tool_response>\n(.*)\n</tool_response>", prompt).group(1))
        assert prompt.endswith("<|im_start|>assistant\n") and answer.endswith("<|im_end|>")
        quoted = answer[: -len("<|im_end|>")].split(" ")
        assert 1 <= len(quoted) <= 3 and 4 <= len(reply) <= 9 and set(reply) - {"status"} <= set(COPY_KEYS)
        for q in quoted:
            key, value = q.split("=")
            assert json.dumps(reply[key]) == value  # the reply's own spelling, every digit


def test_the_loss_is_on_the_answer_tokens_only(tiny):
    _, tok = tiny
    docs = [copy_document(np.random.default_rng(s)) for s in range(3)]
    ids, labels, mask = _batch(tok, docs)
    for row, (prompt, answer) in enumerate(docs):
        n_p = len(tok(prompt, add_special_tokens=False)["input_ids"])
        want = tok(answer, add_special_tokens=False)["input_ids"]
        assert (labels[row, :n_p] == -100).all()
        assert labels[row, n_p:n_p + len(want)].tolist() == want == ids[row, n_p:n_p + len(want)].tolist()
        assert int(mask[row].sum()) == n_p + len(want) and (labels[row, n_p + len(want):] == -100).all()


def test_pretraining_lowers_the_answer_loss_and_is_deterministic(tiny):
    model, tok = tiny
    first = build_tiny(seed=0)[0]
    result = pretrain_copy(first, tok, 40, batch_size=8, log_every=10, seed=1, accuracy_docs=2)
    losses = [loss for _, loss in result.losses]
    # from about ln(vocabulary) to the keys and the format learnt: well under half in 40 steps
    assert losses[0] > 3.0 and losses[-1] < 0.5 * losses[0], losses
    assert 0.0 <= result.accuracy <= 1.0 and not first.training
    again = build_tiny(seed=0)[0]
    pretrain_copy(again, tok, 40, batch_size=8, log_every=10, seed=1, accuracy_docs=2)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), model.state_dict().values()))
    with pytest.raises(ValueError, match="lr"):
        pretrain_copy(model, tok, 1, lr=0.0)


def test_copy_accuracy_counts_exact_answers_only(tiny):
    model, tok = tiny
    assert copy_accuracy(model, tok, n=4) == 0.0  # a random model copies nothing


def test_the_bench_base_unit_pretrains_when_asked(tmp_path):
    from hydroagent_hpc.bench.learning import QUICK, _base

    plain = _base(tmp_path, QUICK, tmp_path / "plain", 0)
    copied = _base(tmp_path, dataclasses.replace(QUICK, copy_steps=3), tmp_path / "copied", 0)
    assert "copy" not in plain and copied["copy"]["steps"] == 3 and len(copied["copy"]["losses"]) == 1
    from hydroagent_hpc.train.tiny import load_tiny

    a, b = load_tiny(plain["model"])[0], load_tiny(copied["model"])[0]
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
