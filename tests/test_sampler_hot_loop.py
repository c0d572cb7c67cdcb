"""The in-process sampler's decode loop (audit F13, "Decode hot loop"): how often it makes the host wait
for the device, top-p without sorting the vocabulary, and per-row seeded draws.

A host sync cannot be observed on the CPU, so the tests count the operations that are one on CUDA:
reading a tensor's value into Python (``item``/``float``/``int``/``bool``, ``tolist``, ``numpy``,
``nonzero``, ``masked_select``) and building a device tensor from host data (``torch.tensor(list)``,
an upload that waits for the stream). Each is attributed to the code that asked for it by walking
the Python stack, so the sampler's own are told apart from the model's (transformers' SDPA mask check
reads one value per forward)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hydroagent_hpc.train.generation.sampler import (
    BatchedSampler,
    Sampling,
    _filter,
    _inverse_cdf,
    _nucleus,
    draw_tokens,
    sampling_probs,
)
from hydroagent_hpc.train.tiny import build_tiny

SAMPLER = str(Path(__file__).resolve().parents[1] / "hydroagent_hpc" / "train" / "generation" / "sampler.py")
#: aten ops that read a device value into the host (a sync on CUDA)
READS = {"aten.item.default", "aten._local_scalar_dense.default", "aten.is_nonzero.default",
         "aten.nonzero.default", "aten.masked_select.default"}
#: aten op of ``torch.tensor(host data)``: an upload (a sync on CUDA for pageable memory)
UPLOADS = {"aten.lift_fresh.default"}


def _owner() -> str:
    """Who asked: ``sampler``, ``model`` (transformers) or ``other``, from the innermost frame outside torch."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name == SAMPLER:
            return "sampler"
        if "/transformers/" in name:
            return "model"
        if "/torch/" not in name and name != __file__:
            return "other"
        f = f.f_back
    return "other"


class HostTraffic(TorchDispatchMode):
    """Counts host reads and uploads by owner while active (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: Counter[tuple[str, str]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in READS:
            self.events["read", _owner()] += 1
        elif name in UPLOADS:
            self.events["upload", _owner()] += 1
        return func(*args, **(kwargs or {}))


def _traffic(monkeypatch, run) -> Counter[tuple[str, str]]:
    mode = HostTraffic()
    for method in ("tolist", "numpy"):  # these read the tensor's memory without dispatching an aten op
        original = getattr(torch.Tensor, method)

        def counted(self, *a, _original=original, **k):
            mode.events["read", _owner()] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, method, counted)
    with mode:
        run()
    monkeypatch.undo()
    return mode.events


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


def _per_step(monkeypatch, model, n: int, sampling: Sampling, forced=None, **kw) -> dict[str, float]:
    """The sampler's (and the model's) host reads and uploads per decode step with ``n`` rows: the
    difference between 9 and 1 new tokens (no stop ids, so every row runs every step), over 8."""
    prompts = [[5 + r, 6, 7, 8 + r] for r in range(n)]
    counts = {}
    for steps in (1, 9):
        s = BatchedSampler(model, (), 0, Sampling(**{**sampling.__dict__, "max_new_tokens": steps}), **kw)
        counts[steps] = _traffic(monkeypatch, lambda s=s: s.sample(prompts, list(range(n)), forced=forced))
    return {f"{kind}/{who}": (counts[9][kind, who] - counts[1][kind, who]) / 8
            for kind in ("read", "upload") for who in ("sampler", "model", "other")}


@pytest.mark.parametrize("sampling,width,reads", [
    (Sampling(greedy=True), 512, 1),
    (Sampling(temperature=1.0, top_p=0.95), 4096, 1),  # candidates cover the vocabulary: never wide
    (Sampling(temperature=1.0, top_p=1.0, top_k=20), 512, 1),
    (Sampling(temperature=1.0, top_p=0.95), 16, 2),  # every row wider than 16 ids: redrawn, one more read
])
def test_a_decode_step_reads_the_device_a_fixed_number_of_times_whatever_the_batch(monkeypatch, tiny, sampling,
                                                                                   width, reads):
    model, _ = tiny
    one = _per_step(monkeypatch, model, 1, sampling, top_p_candidates=width)
    six = _per_step(monkeypatch, model, 6, sampling, top_p_candidates=width)
    assert one["read/sampler"] == six["read/sampler"] == reads, (one, six)
    # nothing is built from host data inside the loop, except the wide rows' index on a redraw step
    assert one["upload/sampler"] == six["upload/sampler"] == reads - 1
    assert one["read/model"] == six["read/model"] <= 1  # transformers' own mask check, once per forward
    assert one["read/other"] == six["read/other"] == 0


def test_forced_rows_add_no_per_step_traffic(monkeypatch, tiny):
    model, _ = tiny
    forced = [None, [9, 10, 11, 12, 13, 14, 15, 16, 17], None]
    got = _per_step(monkeypatch, model, 3, Sampling(temperature=1.0, top_p=0.95), forced=forced,
                    top_p_candidates=4096)
    assert got["read/sampler"] == 1 and got["upload/sampler"] == 0


# ------------------------------------------------------------------------------- top-p, exactly


def _full_sort_reference(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The nucleus by sorting the whole vocabulary (the sampler's rule before F13 was fixed)."""
    scaled = logits / s.temperature
    if s.top_k and s.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, s.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep = torch.zeros_like(before < s.top_p).scatter(-1, order, before < s.top_p)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def test_top_p_from_candidates_is_the_full_sorts_distribution_exactly():
    g = torch.Generator().manual_seed(0)
    covered_rows = wide_rows = 0
    for scale in (0.5, 2.0, 6.0, 12.0):  # flat to peaked rows: nuclei of ~1 to ~950 of 1000 ids
        logits = torch.randn(48, 1000, generator=g) * scale
        for top_p in (0.1, 0.5, 0.9, 0.95, 0.999):
            for top_k in (0, 50):
                s = Sampling(temperature=1.0, top_p=top_p, top_k=top_k)
                ref = _full_sort_reference(logits, s)
                for width in (1, 8, 64, 2000):
                    got = _filter(logits, s, width=width)
                    assert torch.equal(got > 0, ref > 0), (scale, top_p, top_k, width)  # the same kept ids
                    assert torch.equal(got, ref), (scale, top_p, top_k, width)  # the same probabilities
                    covered = _nucleus(sampling_probs(logits, s), top_p, width)[2]
                    covered_rows += int(covered.sum())
                    wide_rows += int((~covered).sum())
    assert covered_rows > 1000 and wide_rows > 1000  # both the candidate path and the full-sort path ran


def test_no_sort_of_the_vocabulary_when_the_candidates_cover_the_nucleus(monkeypatch):
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(1)) * 10
    s = Sampling(temperature=1.0, top_p=0.9)
    probs = sampling_probs(logits, s)
    assert bool(_nucleus(probs, s.top_p, 64)[2].all())  # peaked rows: 64 candidates hold the nucleus
    calls = []
    real_sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **k: calls.append(a[0].shape) or real_sort(*a, **k))
    draw_tokens(probs, torch.rand(4, dtype=torch.float64), s.top_p, 64)
    assert calls == []
    draw_tokens(probs, torch.rand(4, dtype=torch.float64), s.top_p, 5000)  # width >= vocabulary: the full sort
    assert calls == [torch.Size([4, 5000])]


def test_a_uniform_draw_follows_the_filtered_distribution():
    """Inverse-CDF: over an even grid of u, each id comes out in proportion to its probability, and an
    id the filter drops never does."""
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(2)) * 3
    s = Sampling(temperature=0.8, top_p=0.9, top_k=100)
    want = _filter(logits, s).double()
    grid = 20000
    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    probs = sampling_probs(logits, s)
    for width in (4, 300):  # the candidate path (wide rows redrawn from the sort) and the full sort
        counts = torch.zeros_like(want)
        for r in range(3):
            rows = probs[r:r + 1].expand(grid, -1)
            tok, covered = draw_tokens(rows, u, s.top_p, width)
            if not bool(covered.all()):
                from hydroagent_hpc.train.generation.sampler import draw_tokens_sorted

                tok = draw_tokens_sorted(rows, u, s.top_p)
            counts[r] = torch.bincount(tok, minlength=300).double() / grid
        assert torch.all(counts[want == 0] == 0)
        assert torch.allclose(counts, want, atol=1.5 / grid)
    # zero weights never come out, even for u just below 1
    w = torch.tensor([[0.0, 0.2, 0.0, 0.8, 0.0]], dtype=torch.float64)
    assert _inverse_cdf(w, torch.tensor([1 - 2 ** -53], dtype=torch.float64)).tolist() == [3]
    assert _inverse_cdf(w, torch.tensor([0.0], dtype=torch.float64)).tolist() == [1]


# --------------------------------------------------------------------------- seeded, row by row


def _prompt(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_a_seeded_row_draws_the_same_ids_alone_in_a_batch_and_with_any_candidate_width(tiny):
    model, tok = tiny
    a = _prompt(tok, "<|im_start|>user\nCalibrate the CREST model.<|im_end|>\n<|im_start|>assistant\n")
    b = _prompt(tok, "<|im_start|>user\nThe simulated peaks are too low.<|im_end|>\n<|im_start|>assistant\n")
    s = Sampling(temperature=0.1, top_p=0.95, max_new_tokens=24)  # nuclei from 1 to some hundred ids
    narrow = BatchedSampler(model, (), 0, s, top_p_candidates=32)
    full = BatchedSampler(model, (), 0, s, top_p_candidates=4096)
    alone = narrow.sample([a], [11])[0]
    together = narrow.sample([b, a, b], [5, 11, 6])
    assert together[1].ids == alone.ids  # the log-probs agree to the batched matmuls' rounding
    assert torch.allclose(torch.tensor(together[1].logprobs), torch.tensor(alone.logprobs), atol=1e-5)
    assert together[0].ids != together[2].ids
    # the candidates (with wide rows redrawn from the sort) draw what the full sort draws, seed by seed
    assert [x.ids for x in full.sample([b, a, b], [5, 11, 6])] == [x.ids for x in together]
    assert 0 < narrow.stats["top_p_wide_rows"] < 4 * 24  # both paths ran
    # and a seed's draws are its own: another seed, another sample
    assert narrow.sample([a], [12])[0].ids != alone.ids
