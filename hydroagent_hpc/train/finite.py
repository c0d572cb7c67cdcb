"""Non-finite numbers stop a run: a NaN or infinite loss, gradient norm or weight is never stepped on,
checkpointed or written as ``final/``.

Both trainers check, in this order:

- the model's weights when it is loaded (the base model or an SFT checkpoint: :func:`check_weights`
  with :class:`~hydroagent_hpc.errors.ConfigError`, exit status 2) and after a resumed checkpoint is
  loaded;
- each step's loss and gradient norm before the optimizer steps (:func:`check_step`): a non-finite
  one leaves the weights as they were after the previous step;
- the weights after each optimizer step (:func:`check_weights`);
- the weights of ``final/`` before it is written (:func:`first_nonfinite` on the gathered copy).

A run stopped so raises :class:`NonFiniteError` (exit status 1) whose one line names the step, what
is not finite, and the last checkpoint, which is untouched (checkpoints are written only after a step
that passed). With several processes the loss is all-reduced and the gradient norm global, so every
rank stops at the same step; the weight check all-reduces its count of non-finite tensors, so every
rank stops together there too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.train.model_card import write_model_card
from hydroagent_hpc.train.writes import describe_last, write_folder

__all__ = ["NonFiniteError", "first_nonfinite", "check_weights", "check_step", "stopped_at", "describe_last",
           "save_final"]


class NonFiniteError(HydroAgentError):
    """A run stopped by a NaN or infinite loss, gradient or weight (the message names which, the step and
    the last intact checkpoint)."""

    exit_code = 1


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (an FSDP2 DTensor's shard; a plain tensor itself)."""
    to_local = getattr(t, "to_local", None)
    out: torch.Tensor = to_local() if callable(to_local) else t
    return out


def first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first floating-point tensor of ``named`` holding a NaN or an infinity (this rank's
    shards only), or None. One device synchronisation for all tensors."""
    names: list[str] = []
    flags: list[torch.Tensor] = []
    for name, t in named:
        local = _local(t.detach())
        if local.is_floating_point() and local.numel():
            names.append(name)
            flags.append(torch.isfinite(local).all())
    if not flags:
        return None
    ok = torch.stack([f.to(flags[0].device) for f in flags]).cpu()
    bad = torch.nonzero(~ok)
    return names[int(bad[0])] if bad.numel() else None


def check_weights(model: torch.nn.Module, what: str, *, error: type[HydroAgentError] = NonFiniteError,
                  fix: str = "", distributed: bool = False, device: torch.device | None = None) -> None:
    """Raise ``error`` when a parameter or buffer of ``model`` is not finite (``what``: the model and the
    moment, for the message). With ``distributed`` every rank must call it (the count is all-reduced)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    bad = first_nonfinite(named)
    if distributed:
        from hydroagent_hpc.train.distributed import all_reduce_sum

        count = all_reduce_sum(torch.tensor([0.0 if bad is None else 1.0], device=device), True)
        if float(count) == 0:
            return
    elif bad is None:
        return
    where = f"tensor {bad}" if bad is not None else "a tensor of another rank's shard"
    raise error(f"{what}: {where} holds NaN or infinite values",
                fix or "start from a model whose weights are finite (a base model or an earlier checkpoint)")


def check_step(loss: float, grad_norm: float, step: int | None = None) -> None:
    """Raise :class:`NonFiniteError` before an optimizer step whose loss or gradient norm is not finite
    (the weights stay those of the previous step)."""
    parts = [f"{name} is {value!r}" for name, value in (("loss", loss), ("gradient norm", grad_norm))
             if not math.isfinite(value)]
    if not parts:
        return
    at = f"step {step}: " if step is not None else ""
    raise NonFiniteError(f"{at}the {' and the '.join(parts)}; the run stopped before the optimizer step",
                         "lower lr (or max_grad_norm), look for an example or a reward that explodes, then resume "
                         "with --resume from the last checkpoint (or start again)")


def stopped_at(exc: NonFiniteError, run_dir: Any) -> NonFiniteError:
    """``exc`` with what is left on disk: no ``final/``, and the last checkpoint, untouched."""
    return NonFiniteError(f"{exc.message}; no final/ was written, and {describe_last(run_dir)}", exc.fix)



def save_final(final: Any, model: Any, tokenizer: Any, what: str = "the final model", note: str = "") -> None:
    """``final/`` as a save_pretrained folder of ``model`` and ``tokenizer`` with its model card
    (``README.md``, :mod:`hydroagent_hpc.train.model_card`, from the run folder ``final``'s parent),
    written through a temporary folder (:func:`hydroagent_hpc.train.writes.write_folder`: a failed write
    leaves none), and never with non-finite weights (:class:`NonFiniteError` naming the tensor; ``note``
    adds to its message)."""
    bad = first_nonfinite(model.named_parameters())
    if bad is not None:
        raise NonFiniteError(f"{final}: not written, its tensor {bad} holds NaN or infinite values{note}; "
                             f"{describe_last(final.parent)}", "resume from the last checkpoint with a lower lr")

    def write(tmp: Any) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_model_card(tmp, final.parent)  # README.md: renamed into place with the weights, or not at all

    write_folder(final, write, what)
