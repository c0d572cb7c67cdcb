"""Teacher data for SFT: campaign stores -> token-exact, weighted trajectories in one HDF5 file.

``hydroagent train sft-data --from STORE.h5 [--from ...] --out DATA.h5`` calls :func:`build_sft_data`.

Episodes. Each committed episode of each store (stores in the order given, episodes in commit
order) becomes at most one trajectory: its conversation is rebuilt from the store
(:func:`episode_messages`: the system and user prompts the environment rendered from the
recorded basin, preset and budget; per assistant message the text the environment executed,
stored on the message's first turn; one ``tool`` message per recorded observation, rendered as
the environment did) and tokenised with the one
:class:`~hydroagent_hpc.agents.llm.trajectory.TrajectoryBuilder` the local policy and GRPO use,
with the tool schemas the episode's environment announced. Tool messages after the last
assistant turn carry no loss and are left out.

Text. The heuristic hydrologist writes diagnosis + Hermes tool-call text; hosted models keep
their own text (native calls were executed as Hermes text, which is what is stored). Classic
optimizers (dds, sceua, lhs, random, dream) drive the tools directly and write no text: such
episodes are dropped (reason ``no_text``), and a store that holds no episode with text is
refused with :class:`SFTDataError`, since there is nothing in it a language model could imitate,
unless a renderer is chosen (``render``; ``--render``; recorded in the root attribute ``render``):

- ``none`` (the default): as above.
- ``calls``: each tool call of a text-less episode becomes the assistant message an LLM would
  have written to make exactly that call: its Hermes ``<tool_call>`` block alone, no prose (the
  name and the arguments the environment recorded, serialised as :func:`render_hermes` does).
  Such a teacher shows the format and the search, never a diagnosis; mixing it with text agents
  teaches calls without reasons. Episodes with text are never re-rendered.

Presets (reference-implementation.md section 6):

- ``paper``: drop episodes whose final best NSE <= 0.6 (or that never scored one); weight each
  kept episode by the percentile of its final best NSE among the kept episodes of the whole
  data set: the mid-rank percentile ``(below + (ties + 1) / 2) / n`` (``below`` episodes have a
  lower NSE, ``ties`` the same one, itself included; pandas ``rank(method="average", pct=True)``),
  so an untied best episode weighs 1 and an untied worst 1/n.
- ``released``: keep every episode with text; weight ``clip((NSE + 1) / 2, 0.1, 1)`` (the
  authors' released ``prepare_sft_data.py``), an episode without any NSE at the floor 0.1.

Augmentation (``augment``; ``--augment``; default ``stopping_points`` for ``paper``, ``none`` for
``released``; recorded in the root attribute ``augment``). The paper cut about 35 variants per
teacher run at "valid stopping points" (reference-implementation.md section 6); we define them:

- A **valid stopping point** is the end of an assistant turn that follows a successful
  ``evaluate`` tool response: the previous assistant message made an ``evaluate`` call the
  environment answered with a score (turn ``kind == "tool"``, ``tool == "evaluate"``, ``ok``), so
  the agent has just read a score and decides what to do next (propose, refine or stop).
- **Variant k** of an episode is its conversation truncated right after the k-th such assistant
  turn (the tool responses after it carry no loss and are left out); the full conversation is the
  last variant. A variant identical to another (the last assistant turn is itself a stopping
  point, so the full conversation equals the last cut) is dropped. ``none`` gives one example per
  episode, the full conversation.
- The builder is exact-prefix, so variant k's ids, mask and spans are the first
  ``spans[j][1]`` ids of the full trajectory (``j`` the assistant turn of the cut); they are
  sliced from it, which equals building the truncated conversation.
- **Weights.** Each variant is its own example with the episode's weight divided by the number of
  variants of that episode. An episode's total weight, and so the relative weighting of episodes
  (the NSE percentile of ``paper``, the clipped NSE of ``released``), is unchanged by
  augmentation: a long episode with many stopping points does not count more than a short one.

Error recovery (``recovery``; ``--recovery P``, default 0 = off; ``recovery_seed``,
``--recovery-seed``, default 0; recorded in the root attributes ``recovery``, ``recovery_seed``
and JSON ``recovery_kinds``). A model trained only on clean teacher calls has never seen the
environment's parse-failure reply, so after its first malformed call it derails (docs/grpo.md,
"SFT learning on CPU"). With probability P per eligible assistant message, the builder inserts
before it

1. an assistant message holding a **corrupted copy** of its tool call (same prose, broken
   block), marked ``"train": False`` so its ids are mask 0 (the model must never learn to write
   it; :mod:`hydroagent_hpc.agents.llm.trajectory`);
2. the environment's reply to it: the corrupted text goes through the environment's own parser
   (:func:`~hydroagent_hpc.env.toolcalls.parse_message` with the episode's
   ``max_calls_per_message`` and ``max_message_chars``) and each failure through
   :func:`~hydroagent_hpc.env.environment.parse_failure_observation` and
   :func:`~hydroagent_hpc.env.toolcalls.render_tool_response`, the path a live episode takes, so
   the text is exactly what inference shows;

and then keeps (3) the original, correct message (mask 1, as without recovery). A corrupted
copy that the parser accepts (or that yields a call) is a bug and stops the build. Corruptions
(:data:`RECOVERY_KINDS`, one drawn uniformly per inserted turn) break the JSON body between the
tags, which stay; the body is the parsed call re-serialised as
:func:`~hydroagent_hpc.env.toolcalls.render_hermes` writes it:

- ``repeated_key``: one argument key written twice (the first argument again, at the end of the
  arguments object), or ``"name"`` twice for a call without arguments; the strict decoder
  refuses duplicate keys (``malformed_json``).
- ``value_for_object``: the first argument's value where the arguments object belongs
  (``"arguments": 0.549``), or ``[]`` when the call has no arguments or its first value is not a
  number (``bad_arguments``).
- ``truncated``: the JSON body cut at a random character in its second half, the closing tag
  still written (``malformed_json``).
- ``missing_brace``: the body without its final ``}`` (``malformed_json``).

Eligible messages hold exactly one tool-call block that parses to one call and no failure (the
heuristic's messages; a message with several calls is left alone, since the environment would
run its valid calls and reply to them too). Episodes whose environment ends on a message
without a call (``end_on_no_tool_call``) get no recovery turn: inference would end there. The
draws are seeded by ``recovery_seed`` and the episode id (each episode has its own generator), so
the same inputs give the same file, and an episode's turns do not depend on the other episodes.
Stopping points keep pointing at the original messages (the inserted pair comes before the
message it corrects). ``P = 0`` writes the same datasets as a build without this option.

Examples stay in the original episode order, the variants of an episode in increasing length.
Sequences longer than ``max_tokens`` are refused (every such episode named, with its length) and
nothing is written: they are never truncated silently.

Output (:data:`DATA_SCHEMA`, written to a temporary file beside ``out`` and renamed into place):
ragged ``input_ids`` (int32) and ``assistant_mask`` (uint8) concatenated, addressed by
``offsets`` (n + 1); ``spans`` (per assistant turn ``[start, end)`` relative to its sequence)
addressed by ``span_offsets``; per example ``weight``, ``best_nse``, ``episode_id`` (the source
episode), ``variant`` (0-based index among its episode's variants), ``n_variants``, ``basin_id``,
``agent``, ``source`` (index into the sources); root attributes ``preset``, ``augment``,
``render``, ``recovery``, ``recovery_seed``, ``recovery_kinds``,
``tokenizer``, ``max_tokens``, ``git_commit``, ``created_utc`` and JSON ``sources`` (path,
sha256, episodes), ``counts`` (kept/dropped episodes and examples per basin and agent),
``weights`` (distribution of the episode weights) and ``lengths`` (of the examples).
:class:`SFTDataset` reads it as a ``torch.utils.data.Dataset``.

Hugging Face form (``--export-hf DIR``; ``export_hf=`` of :func:`build_sft_data`;
:func:`export_hf_dataset`): the same examples as conversational records in ``DIR/train.jsonl``
(messages with standard ``tool_calls``, tools, weight, episode id, final NSE, per-message training
mask; :mod:`hydroagent_hpc.train.sft.hf_data`) and a dataset card ``DIR/README.md``. Each record is
read back and tokenised before anything is written and must give its example's ids, mask and spans.
:func:`import_hf_dataset` (``hydroagent train sft-import``) turns such records, ours or another
project's, into a data file (preset ``imported``) with the same builder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from hydroagent_hpc.agents.llm.trajectory import Trajectory, TrajectoryBuilder, TrajectoryError
from hydroagent_hpc.config import EnvConfig
from hydroagent_hpc.env import prompts
from hydroagent_hpc.env.environment import parse_failure_observation
from hydroagent_hpc.env.episode import ROLE_TOOL
from hydroagent_hpc.env.toolcalls import (
    CLOSE_TAG,
    OPEN_TAG,
    ParseFailure,
    parse_message,
    render_hermes,
    render_tool_response,
    tool_schemas,
)
from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.params import ParameterSet, parameter_set
from hydroagent_hpc.provenance import git_commit
from hydroagent_hpc.sim.manifest import file_sha256
from hydroagent_hpc.store import iter_episodes
from hydroagent_hpc.store.writer import install_file
from hydroagent_hpc.train.sft import hf_data
from hydroagent_hpc.types import Basin, Episode, ToolCall

log = logging.getLogger(__name__)

__all__ = ["SFT_PRESETS", "AUGMENT_MODES", "RENDERERS", "RECOVERY_KINDS", "corrupt_call", "failure_replies",
           "add_recovery_turns",
           "render_calls", "DEFAULT_AUGMENT", "PAPER_MIN_NSE", "stopping_points", "DATA_SCHEMA",
           "SFTDataError", "SFTDataReport", "episode_messages",
           "episode_tools", "paper_weights", "released_weights", "load_tokenizer", "build_sft_data", "SFTDataset",
           "IMPORTED", "export_hf_dataset", "import_hf_dataset"]

SFT_PRESETS = ("paper", "released")
#: ``augment`` modes (see the module doc).
AUGMENT_MODES = ("none", "stopping_points")
#: How episodes without assistant text (classic optimizers) are treated (module doc).
RENDERERS = ("none", "calls")
#: The corruptions of an error-recovery turn (module doc, "Error recovery").
RECOVERY_KINDS = ("repeated_key", "value_for_object", "truncated", "missing_brace")
#: The ``augment`` mode of each preset when none is given.
DEFAULT_AUGMENT = {"paper": "stopping_points", "released": "none"}
#: ``paper`` drops episodes whose final best NSE is at or below this.
PAPER_MIN_NSE = 0.6
#: The ``preset`` attribute of a data file made by :func:`import_hf_dataset`.
IMPORTED = "imported"
#: Root attribute ``schema`` of a data file.
DATA_SCHEMA = "hydroagent_hpc.sft_data"
DATA_VERSION = 2


class SFTDataError(HydroAgentError, ValueError):
    """Teacher data that cannot be built (the message names the store or episodes and the fix)."""


# ---------------------------------------------------------------------------------------------
# An episode's conversation


def _budget(env: dict[str, Any], target: float | None) -> prompts.Budget:
    """The prompts' budget of an episode, from its recorded environment config (as the
    environment computes it: the rounds protocol without a simulation limit announces
    ``max_rounds * candidates_per_round`` simulations)."""
    names = {f.name for f in dataclasses.fields(prompts.Budget)}
    values = {k: v for k, v in env.items() if k in names}
    if values.get("protocol") == "rounds" and values.get("max_simulations") is None:
        values["max_simulations"] = int(values["max_rounds"]) * int(values["candidates_per_round"])
    values["target_nse"] = target
    return prompts.Budget(**values)


def has_text(episode: Episode) -> bool:
    """True when some turn carries assistant text (classic optimizers write none)."""
    return any(t.text for t in episode.turns)


def render_calls(episode: Episode) -> Episode:
    """``episode`` with the ``calls`` renderer's text on every turn (see the module doc).

    Each turn of a text-less episode is its own assistant message (direct tool calls); a turn that
    is not a recorded tool call (a parse failure, which a direct agent cannot make) is refused.
    """
    turns = []
    for t in episode.turns:
        if t.kind != "tool" or not t.tool:
            raise SFTDataError(f"episode {episode.episode_id!r}: turn {t.index} is a {t.kind}, not a tool call; "
                               f"the calls renderer only renders recorded tool calls",
                               fix="use --render none for this store")
        turns.append(dataclasses.replace(t, text=render_hermes(ToolCall(t.tool, dict(t.arguments or {})))))
    return dataclasses.replace(episode, turns=turns)


def episode_messages(episode: Episode) -> list[dict[str, str]]:
    """The conversation of a stored text episode: system, user, then per assistant message its
    text and one tool message per recorded turn (observation rendered as the environment did).

    Raises :class:`SFTDataError` when the episode has no text or lacks what the prompts need.
    """
    eid = episode.episode_id
    if not has_text(episode):
        raise SFTDataError(f"episode {eid!r} (agent {episode.agent!r}) has no assistant text: it was driven "
                           f"through the tools directly (a classic optimizer), so there is nothing to imitate",
                           fix="build teacher data from text agents (heuristic, hosted or local models)")
    cfg: dict[str, Any] = dict(episode.config or {})
    try:
        basin = Basin(**cfg["basin"])
        budget = _budget(cfg["env"], cfg.get("target_nse"))
    except (KeyError, TypeError, ValueError) as exc:
        raise SFTDataError(f"episode {eid!r}: its recorded config lacks the basin or environment the prompts "
                           f"need ({type(exc).__name__}: {exc})",
                           fix="rerun the campaign with this version of hydroagent_hpc") from None
    messages = prompts.render_messages(basin, episode.preset, budget, episode_parameters(episode))
    current = None
    for turn in episode.turns:
        if turn.message_index != current:
            if current is not None and turn.message_index != current + 1:
                raise SFTDataError(f"episode {eid!r}: assistant message {current + 1} has no recorded turn, so its "
                                   f"text is unknown", fix="drop this episode or rerun it")
            current = turn.message_index
            messages.append({"role": "assistant", "content": turn.text})
        messages.append({"role": ROLE_TOOL, "content": render_tool_response(turn.observation or {})})
    return messages


def stopping_points(episode: Episode) -> list[int]:
    """0-based indices (among the assistant messages) of the valid stopping points of ``episode``:
    the assistant messages whose previous message made an ``evaluate`` call that was answered with
    a score (a ``tool`` turn of ``evaluate`` that is ``ok``). See the module doc."""
    evaluated = {t.message_index for t in episode.turns if t.kind == "tool" and t.tool == "evaluate" and t.ok}
    messages = sorted({t.message_index for t in episode.turns})
    first = messages[0] if messages else 0
    return [m - first for m in messages if m - 1 in evaluated]


def _variants(traj: Trajectory, points: Sequence[int]) -> list[tuple[int, Trajectory]]:
    """``(n_turns, trajectory)`` of each variant: cut after each stopping point, then the full one,
    duplicates dropped (exact prefixes of ``traj``, see the module doc)."""
    n = len(traj.spans)
    cuts = sorted({p + 1 for p in points if 0 <= p < n} | {n})
    out = []
    for c in cuts:
        if c == n:
            out.append((c, traj))
            continue
        end = traj.spans[c - 1][1]
        out.append((c, Trajectory(traj.input_ids[:end], traj.assistant_mask[:end], traj.spans[:c],
                                  traj.message_index[:c], "")))
    return out


def episode_parameters(episode: Episode) -> ParameterSet:
    """The parameter set of the episode's basin (with Snow-17 when its config records ``snow17``)."""
    return parameter_set(bool((episode.config or {}).get("snow17")))


def episode_tools(episode: Episode) -> list[dict[str, Any]]:
    """The tool schemas the episode's environment announced."""
    env: dict[str, Any] = dict((episode.config or {}).get("env") or {})  # type: ignore[call-overload]
    return tool_schemas(clip_out_of_bounds=bool(env.get("clip_out_of_bounds", True)),
                        parameters=episode_parameters(episode))


# ---------------------------------------------------------------------------------------------
# Error-recovery turns


def _call_block(text: str) -> tuple[int, int, dict[str, Any]] | None:
    """``(start, end, call)`` of the body of the one tool-call block of ``text`` (between the tags)
    when the message holds exactly one block that parses to one call and no failure, else None."""
    if text.count(OPEN_TAG) != 1 or text.count(CLOSE_TAG) != 1:
        return None
    parsed = parse_message(text)
    if len(parsed.calls) != 1 or parsed.failures:
        return None
    start = text.index(OPEN_TAG) + len(OPEN_TAG)
    end = text.index(CLOSE_TAG)
    if end < start:
        return None
    call = parsed.calls[0]
    return start, end, {"name": call.name, "arguments": dict(call.arguments)}


def corrupt_call(text: str, kind: str, rng: np.random.Generator) -> str:
    """``text`` (an assistant message with one tool-call block) with that block's JSON corrupted
    the ``kind`` way (:data:`RECOVERY_KINDS`, module doc); prose and tags are kept.

    Raises ValueError for an unknown kind or a message without exactly one parsable call.
    """
    block = _call_block(text)
    if block is None:
        raise ValueError("the message does not hold exactly one parsable tool-call block")
    start, end, call = block
    name, args = json.dumps(call["name"], ensure_ascii=False), call["arguments"]
    args_json = json.dumps(args, ensure_ascii=False)
    if kind == "repeated_key":
        if args:
            key = next(iter(args))
            again = f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(args[key], ensure_ascii=False)}"
            body = f'{{"name": {name}, "arguments": {args_json[:-1]}, {again}}}}}'
        else:
            body = f'{{"name": {name}, "name": {name}, "arguments": {args_json}}}'
    elif kind == "value_for_object":
        first = next(iter(args.values()), None)
        number = isinstance(first, (int, float)) and not isinstance(first, bool)  # an object or a JSON
        value = json.dumps(first) if number else "[]"  # string could hold a valid arguments object
        body = f'{{"name": {name}, "arguments": {value}}}'
    elif kind == "truncated":
        full = f'{{"name": {name}, "arguments": {args_json}}}'
        body = full[:int(rng.integers(len(full) // 2, len(full) - 1))]
    elif kind == "missing_brace":
        body = f'{{"name": {name}, "arguments": {args_json}'
    else:
        raise ValueError(f"unknown corruption {kind!r}; the kinds are {', '.join(RECOVERY_KINDS)}")
    return f"{text[:start]}\n{body}\n{text[end:]}"


def failure_replies(text: str, env: EnvConfig) -> tuple[list[str], list[ParseFailure]]:
    """The tool messages the environment answers an assistant message with when none of its
    blocks is a call: the environment's parser, then its parse-failure observation, rendered as
    a live episode renders it. Also returns the failures (for the check that they are failures)."""
    parsed = parse_message(text, max_calls=env.max_calls_per_message, max_chars=env.max_message_chars)
    failures = [item for item in parsed.items() if isinstance(item, ParseFailure)]
    if parsed.calls:
        return [], []
    return [render_tool_response(parse_failure_observation(f.reason, f.detail)) for f in failures], failures


def _env_config(episode: Episode) -> EnvConfig:
    """The parser limits and stop rules of the episode's environment (defaults for keys it lacks)."""
    env: dict[str, Any] = dict((episode.config or {}).get("env") or {})  # type: ignore[call-overload]
    names = ("max_calls_per_message", "max_message_chars", "end_on_no_tool_call")
    return dataclasses.replace(EnvConfig(), **{k: env[k] for k in names if env.get(k) is not None})


def _episode_rng(seed: int, episode_id: str) -> np.random.Generator:
    """A generator of its own per episode: seeded by the build's seed and the episode id."""
    digest = hashlib.sha256(episode_id.encode("utf-8")).digest()
    return np.random.default_rng([int(seed), int.from_bytes(digest[:8], "little")])


def add_recovery_turns(messages: list[dict[str, Any]], episode: Episode, p: float, seed: int = 0
                       ) -> tuple[list[dict[str, Any]], list[int], Counter[str]]:
    """``messages`` with error-recovery turns (module doc): before each eligible assistant message,
    with probability ``p``, a mask-0 corrupted copy and the environment's reply.

    Returns the new messages, for each original assistant message its index among the new
    assistant messages (to move stopping points), and the count of each corruption kind inserted.
    Raises :class:`SFTDataError` when a corrupted copy is not a parse failure (a bug).
    """
    env = _env_config(episode)
    out: list[dict[str, Any]] = []
    where: list[int] = []
    kinds: Counter[str] = Counter()
    n_assistant = 0
    rng = _episode_rng(seed, episode.episode_id)
    for m in messages:
        if m.get("role") == "assistant":
            draw = rng.random()  # one draw per message, eligible or not: the sequence stays aligned
            text = m.get("content")
            if (p > 0 and draw < p and not env.end_on_no_tool_call and isinstance(text, str)
                    and _call_block(text) is not None):
                kind = RECOVERY_KINDS[int(rng.integers(len(RECOVERY_KINDS)))]
                bad = corrupt_call(text, kind, rng)
                replies, failures = failure_replies(bad, env)
                if not replies:
                    raise SFTDataError(f"episode {episode.episode_id!r}: the {kind} corruption of an assistant "
                                       f"message is not a parse failure ({bad!r})",
                                       fix="report this: every corruption must fail the environment's parser")
                out.append({"role": "assistant", "content": bad, "train": False})
                out += [{"role": ROLE_TOOL, "content": r} for r in replies]
                kinds[kind] += 1
                n_assistant += 1
            where.append(n_assistant)
            n_assistant += 1
        out.append(m)
    return out, where, kinds


# ---------------------------------------------------------------------------------------------
# Weights


def paper_weights(nse: Sequence[float]) -> np.ndarray:
    """Mid-rank percentile of each final NSE among ``nse`` (ascending ranks, ties averaged, / n)."""
    import pandas as pd

    x = pd.Series(np.asarray(nse, dtype=float))
    return x.rank(method="average", pct=True).to_numpy(dtype=float) if len(x) else np.zeros(0)


def released_weights(nse: Sequence[float | None]) -> np.ndarray:
    """``clip((NSE + 1) / 2, 0.1, 1)``; a missing NSE gets the floor 0.1."""
    x = np.array([-math.inf if v is None or not math.isfinite(v) else v for v in nse], dtype=float)
    return np.clip((x + 1.0) / 2.0, 0.1, 1.0)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def load_tokenizer(name: str) -> Any:
    """``"tiny"``: the offline tiny Qwen3 tokenizer (:mod:`hydroagent_hpc.train.tiny`); otherwise a
    local folder or hub id for ``AutoTokenizer.from_pretrained`` (its own chat template)."""
    if name == "tiny":
        from hydroagent_hpc.train.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise SFTDataError(f"--tokenizer {name}: cannot load a tokenizer ({exc})",
                           fix="pass a save_pretrained folder, a cached hub id, or 'tiny'") from None
    if not getattr(tok, "chat_template", None):
        raise SFTDataError(f"--tokenizer {name}: the tokenizer has no chat template",
                           fix="use an instruct checkpoint's tokenizer (Qwen3-*-Instruct) or 'tiny'")
    return tok


# ---------------------------------------------------------------------------------------------
# The data set


@dataclass
class _Example:
    episode_id: str
    basin_id: str
    agent: str
    source: int
    best_nse: float | None
    weight: float = 0.0
    variant: int = 0
    n_variants: int = 1
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation the example tokenises
    tools: list[dict[str, Any]] | None = None  # the tool schemas the template received


@dataclass
class SFTDataReport:
    """What :func:`build_sft_data` kept, dropped and wrote (also stored in the file's attributes)."""

    out: Path
    preset: str
    kept: int  # episodes
    dropped: dict[str, int]
    counts: dict[str, dict[str, Any]]
    weights: dict[str, Any]
    lengths: dict[str, Any]
    sources: list[dict[str, Any]] = field(default_factory=list)
    augment: str = "none"
    examples: int = 0
    render: str = "none"
    recovery: float = 0.0
    recovery_turns: int = 0  # corrupted calls inserted (module doc, "Error recovery")
    recovery_kinds: dict[str, int] = field(default_factory=dict)
    recovery_seed: int = 0


def _summary(x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        return {}
    q = np.quantile(x, [0.0, 0.25, 0.5, 0.75, 0.9, 1.0])
    return {"n": int(len(x)), "mean": float(x.mean()), "min": float(q[0]), "p25": float(q[1]),
            "median": float(q[2]), "p75": float(q[3]), "p90": float(q[4]), "max": float(q[5])}


def _check_arguments(stores: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], preset: str,
                     max_tokens: int, augment: str | None, render: str, recovery: float,
                     recovery_seed: int) -> tuple[str, float, list[Path], Path]:
    """The arguments of :func:`build_sft_data` checked before anything is read: (augment mode, recovery
    probability, store paths, output path); :class:`SFTDataError` for the first that is wrong."""
    if preset not in SFT_PRESETS:
        raise SFTDataError(f"--preset {preset!r}: unknown", fix=f"use one of {', '.join(SFT_PRESETS)}")
    augment = DEFAULT_AUGMENT[preset] if augment is None else augment
    if augment not in AUGMENT_MODES:
        raise SFTDataError(f"--augment {augment!r}: unknown", fix=f"use one of {', '.join(AUGMENT_MODES)}")
    if isinstance(recovery_seed, bool) or not isinstance(recovery_seed, (int, np.integer)) or recovery_seed < 0:
        raise SFTDataError(f"--recovery-seed {recovery_seed!r}: must be a whole number >= 0")
    if render not in RENDERERS:
        raise SFTDataError(f"--render {render!r}: unknown", fix=f"use one of {', '.join(RENDERERS)}")
    if isinstance(recovery, bool) or not (isinstance(recovery, (int, float)) and 0.0 <= float(recovery) <= 1.0):
        raise SFTDataError(f"--recovery {recovery!r}: must be a probability in [0, 1]",
                           fix="pass e.g. --recovery 0.3 (0 turns error-recovery turns off)")
    recovery = float(recovery)
    if int(max_tokens) < 1:
        raise SFTDataError(f"--max-tokens {max_tokens}: must be at least 1")
    if not stores:
        raise SFTDataError("no store given", fix="pass --from STORE.h5 (repeatable)")
    paths = [Path(s) for s in stores]
    for p in paths:
        if not p.is_file():
            raise SFTDataError(f"--from {p}: no such episode store", fix="pass the .h5 file a campaign wrote")
    out = Path(out)
    if any(out.resolve() == p.resolve() for p in paths):
        raise SFTDataError(f"--out {out} is one of the stores read", fix="write the data to another file")
    return augment, recovery, paths, out


def _read_stores(paths: list[Path], render: str) -> tuple[list[_Example], list[Episode],
                                                          dict[tuple[str, str], Counter[str]], list[dict[str, Any]]]:
    """The episodes with assistant text of each store (turns, config and scores only; ``render: calls``
    gives text-less episodes their calls as text): (examples, episodes, dropped per (basin, agent), sources).
    A store without any text episode is refused."""
    examples: list[_Example] = []
    episodes: list[Episode] = []
    dropped: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    sources: list[dict[str, Any]] = []
    for s, p in enumerate(paths):
        # only turns, config and scores are needed: drop simulations and series as they are read
        eps = [dataclasses.replace(e, sims=[], times=None, observed=None, warmup=None) for e in iter_episodes(p)]
        if render == "calls":
            eps = [e if has_text(e) or not e.turns else render_calls(e) for e in eps]
        text = [e for e in eps if has_text(e)]
        if not text:
            agents = sorted({e.agent for e in eps})
            raise SFTDataError(
                f"--from {p}: no episode with assistant text ({len(eps)} episodes"
                + (f", agents {', '.join(agents)}" if agents else "") + "); classic optimizers drive the tools "
                "directly and write no text a model could imitate",
                fix="pass stores of text agents (heuristic, hosted or local language models), or render the "
                    "optimizers' calls as text with --render calls")
        for e in eps:
            if not has_text(e):
                dropped[(e.basin_id, e.agent)]["no_text"] += 1
                continue
            examples.append(_Example(e.episode_id, e.basin_id, e.agent, s, e.best_nse))
            episodes.append(e)
        sources.append({"path": str(p.resolve()), "sha256": file_sha256(p), "episodes": len(eps)})
    return examples, episodes, dropped, sources


def _filter_and_weight(examples: list[_Example], episodes: list[Episode], preset: str,
                       dropped: dict[tuple[str, str], Counter[str]]) -> list[tuple[_Example, Episode]]:
    """The episodes ``preset`` keeps (paper: final best NSE > :data:`PAPER_MIN_NSE`), each example's
    weight set; the others counted in ``dropped``. None left is refused."""
    if preset == "paper":
        keep = [ex.best_nse is not None and math.isfinite(ex.best_nse) and ex.best_nse > PAPER_MIN_NSE
                for ex in examples]
        for ex, k in zip(examples, keep):
            if not k:
                dropped[(ex.basin_id, ex.agent)]["nse_le_0.6"] += 1
        pairs = [(ex, e) for ex, e, k in zip(examples, episodes, keep) if k]
        w = paper_weights([float(ex.best_nse) for ex, _ in pairs])  # type: ignore[arg-type]
    else:
        pairs = list(zip(examples, episodes))
        w = released_weights([ex.best_nse for ex, _ in pairs])
    if not pairs:
        raise SFTDataError(f"preset {preset}: no episode is left of {len(examples)} with text "
                           f"(paper keeps final best NSE > {PAPER_MIN_NSE})",
                           fix="add stores with better episodes, or use --preset released")
    for (ex, _), wi in zip(pairs, w):
        ex.weight = float(wi)
    return pairs


def _tokenise(pairs: list[tuple[_Example, Episode]], tokenizer: Any, augment: str, recovery: float,
              recovery_seed: int, max_tokens: int, paths: list[Path]
              ) -> tuple[list[tuple[_Example, Trajectory]], Counter[str]]:
    """Token-exact trajectories of the kept episodes (error-recovery turns added, stopping-point variants
    split, weights shared among an episode's variants): (examples with their trajectories, recovery turns
    by kind). Any sequence over ``max_tokens`` is refused (never truncated)."""
    builders: dict[str, TrajectoryBuilder] = {}
    kinds: Counter[str] = Counter()
    too_long: list[tuple[str, int]] = []
    built: list[tuple[_Example, Trajectory]] = []
    for ex, e in pairs:
        tools = episode_tools(e)
        key = json.dumps(tools, sort_keys=True)
        b = builders.get(key) or builders.setdefault(key, TrajectoryBuilder(tokenizer, tools=tools))
        messages: list[dict[str, Any]] = list(episode_messages(e))
        points = stopping_points(e) if augment == "stopping_points" else []
        if recovery > 0:
            messages, where, added = add_recovery_turns(messages, e, recovery, recovery_seed)
            kinds.update(added)
            points = [where[q] for q in points if 0 <= q < len(where)]
        try:
            traj = b.build(messages)
        except TrajectoryError as exc:
            raise SFTDataError(f"episode {ex.episode_id!r} of {paths[ex.source]}: {exc.message}", fix=exc.fix) from None
        if len(traj) > max_tokens:
            too_long.append((ex.episode_id, len(traj)))
        variants = _variants(traj, points)
        for vi, (_, v) in enumerate(variants):
            built.append((dataclasses.replace(ex, weight=ex.weight / len(variants), variant=vi,
                                              n_variants=len(variants),
                                              messages=messages[:v.message_index[-1] + 1], tools=tools), v))
    lengths = np.array([len(t) for _, t in built])
    if too_long:
        named = ", ".join(f"{eid} ({n} tokens)" for eid, n in too_long[:10])
        more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
        raise SFTDataError(f"{len(too_long)} of {len(pairs)} episode sequences exceed --max-tokens {max_tokens}: "
                           f"{named}{more}; "
                           f"nothing was written (sequences are never truncated)",
                           fix=f"raise --max-tokens to at least {int(lengths.max())}, or build from shorter episodes")
    return built, kinds


def _report(out: Path, preset: str, pairs: list[tuple[_Example, Episode]], built: list[tuple[_Example, Trajectory]],
            dropped: dict[tuple[str, str], Counter[str]], sources: list[dict[str, Any]], max_tokens: int,
            augment: str, render: str, recovery: float, kinds: Counter[str], recovery_seed: int) -> SFTDataReport:
    """What was kept and dropped per (basin, agent), the weights' and lengths' summaries, the sources."""
    lengths = np.array([len(t) for _, t in built])
    kept_by: Counter[tuple[str, str]] = Counter((ex.basin_id, ex.agent) for ex, _ in pairs)
    examples_by: Counter[tuple[str, str]] = Counter((ex.basin_id, ex.agent) for ex, _ in built)
    counts: dict[str, dict[str, Any]] = {}
    for group in sorted(set(kept_by) | set(dropped)):
        d = dict(sorted(dropped[group].items()))
        counts[f"{group[0]}/{group[1]}"] = {"basin": group[0], "agent": group[1], "kept": int(kept_by[group]),
                                        "examples": int(examples_by[group]), "dropped": int(sum(d.values())),
                                        "dropped_by": d}
    weights = np.array([ex.weight for ex, _ in pairs])
    hist, edges = np.histogram(weights, bins=10, range=(0.0, 1.0))
    weight_info = {**_summary(weights), "histogram": hist.tolist(), "edges": [round(float(v), 2) for v in edges]}
    assistant = np.array([t.n_assistant_tokens for _, t in built])
    length_info = {**_summary(lengths.astype(float)), "budget": int(max_tokens), "total_tokens": int(lengths.sum()),
                   "assistant_tokens": int(assistant.sum()), "over_budget": 0,
                   "max_share_of_budget": float(lengths.max() / max_tokens)}
    dropped_total: Counter[str] = Counter()
    for c in dropped.values():
        dropped_total.update(c)
    report = SFTDataReport(out, preset, len(pairs), dict(dropped_total), counts, weight_info, length_info, sources,
                           augment, len(built), render, recovery, int(sum(kinds.values())),
                           dict(sorted(kinds.items())), int(recovery_seed))
    return report


def build_sft_data(stores: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, preset: str = "paper",
                   tokenizer: Any = "tiny", max_tokens: int = 16384, tokenizer_name: str | None = None,
                   augment: str | None = None, render: str = "none", recovery: float = 0.0,
                   recovery_seed: int = 0, export_hf: str | os.PathLike[str] | None = None) -> SFTDataReport:
    """Read ``stores``, filter and weight by ``preset``, tokenise, augment, and write ``out`` atomically.

    ``tokenizer``: a tokenizer object or a name for :func:`load_tokenizer`. ``augment``: one of
    :data:`AUGMENT_MODES` (None: the preset's :data:`DEFAULT_AUGMENT`). ``recovery``: the
    probability of an error-recovery turn before each eligible teacher message, ``recovery_seed``
    its seed (module doc, "Error recovery"). Raises :class:`SFTDataError` for a missing store, a
    store without text episodes, an unknown preset or augment mode, a ``recovery`` outside
    [0, 1], no episode left, or sequences longer than ``max_tokens``; nothing is written then.
    ``export_hf``: a folder that also gets the examples as a conversational JSON Lines data set
    (:func:`export_hf_dataset`).
    """
    augment, recovery, paths, out = _check_arguments(stores, out, preset, max_tokens, augment, render, recovery,
                                                     recovery_seed)
    if isinstance(tokenizer, str):
        tokenizer_name = tokenizer_name or tokenizer
        tokenizer = load_tokenizer(tokenizer)
    tokenizer_name = tokenizer_name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    # 1. read: which episodes have text, their final NSE
    examples, episodes, dropped, sources = _read_stores(paths, render)
    # 2. filter and weight
    pairs = _filter_and_weight(examples, episodes, preset, dropped)
    # 3. tokenise with the shared builder (one per tool-schema variant)
    built, kinds = _tokenise(pairs, tokenizer, augment, recovery, recovery_seed, max_tokens, paths)
    # 4. report
    report = _report(out, preset, pairs, built, dropped, sources, max_tokens, augment, render, recovery, kinds,
                     recovery_seed)
    _log_report(report)
    # 5. write atomically
    _write(out, built, report, tokenizer_name)
    if export_hf is not None:
        export_hf_dataset(built, export_hf, tokenizer, data_file=out, report=report, tokenizer_name=tokenizer_name)
    return report


def _log_report(r: SFTDataReport) -> None:
    log.info("sft-data %s: kept %d episodes -> %d examples (augment %s), dropped %s", r.preset, r.kept, r.examples,
             r.augment, r.dropped or "none")
    if r.recovery:
        log.info("error recovery p=%g seed %d: %d corrupted calls inserted (mask 0) %s", r.recovery, r.recovery_seed,
                 r.recovery_turns, r.recovery_kinds)
    for row in r.counts.values():
        log.info("  %-24s %-16s kept %4d examples %4d dropped %4d %s", row["basin"], row["agent"], row["kept"],
                 row["examples"], row["dropped"], row["dropped_by"] or "")
    w = r.weights
    log.info("episode weights: min %.3f median %.3f mean %.3f max %.3f; histogram over [0,1] in tenths %s",
             w["min"], w["median"], w["mean"], w["max"], w["histogram"])
    n = r.lengths
    log.info("example tokens: median %d p90 %d max %d of budget %d (%.0f%%); %d tokens, %d by the model",
             n["median"], n["p90"], n["max"], n["budget"], 100 * n["max_share_of_budget"], n["total_tokens"],
             n["assistant_tokens"])


#: The root attribute ``weighting`` of each preset (``imported``: :func:`import_hf_dataset`).
_WEIGHTING = {"paper": "mid-rank percentile of final best NSE among kept episodes (NSE > 0.6)",
              "released": "clip((best NSE + 1) / 2, 0.1, 1)",
              IMPORTED: "the weight column of the imported conversational data set"}


def _write(out: Path, pairs: list[tuple[_Example, Trajectory]], r: SFTDataReport, tokenizer_name: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.create-{os.getpid()}.tmp")
    trajs = [t for _, t in pairs]
    lengths = np.array([len(t) for t in trajs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n_spans = np.array([len(t.spans) for t in trajs], dtype=np.int64)
    span_offsets = np.concatenate([[0], np.cumsum(n_spans)]).astype(np.int64)
    string = h5py.string_dtype("utf-8")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs.update({"schema": DATA_SCHEMA, "schema_version": DATA_VERSION, "preset": r.preset,
                            "augment": r.augment, "render": r.render, "recovery": float(r.recovery),
                            "recovery_seed": int(r.recovery_seed), "recovery_kinds": json.dumps(r.recovery_kinds),
                            "tokenizer": tokenizer_name, "max_tokens": int(r.lengths["budget"]),
                            "git_commit": git_commit(),
                            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "sources": json.dumps(r.sources), "counts": json.dumps(r.counts),
                            "dropped": json.dumps(r.dropped), "weights": json.dumps(r.weights),
                            "lengths": json.dumps(r.lengths),
                            "weighting": _WEIGHTING.get(r.preset, "clip((best NSE + 1) / 2, 0.1, 1)")})
            f.create_dataset("input_ids", data=np.concatenate([t.input_ids for t in trajs]).astype(np.int32))
            f.create_dataset("assistant_mask", data=np.concatenate([t.assistant_mask for t in trajs]).astype(np.uint8))
            f.create_dataset("offsets", data=offsets)
            spans = [np.asarray(t.spans, dtype=np.int64).reshape(-1, 2) for t in trajs]
            f.create_dataset("spans", data=np.concatenate(spans) if spans else np.zeros((0, 2), np.int64))
            f.create_dataset("span_offsets", data=span_offsets)
            f.create_dataset("weight", data=np.array([ex.weight for ex, _ in pairs], dtype=np.float64))
            f.create_dataset("best_nse", data=np.array([np.nan if ex.best_nse is None else ex.best_nse
                                                        for ex, _ in pairs], dtype=np.float64))
            f.create_dataset("source", data=np.array([ex.source for ex, _ in pairs], dtype=np.int32))
            f.create_dataset("variant", data=np.array([ex.variant for ex, _ in pairs], dtype=np.int32))
            f.create_dataset("n_variants", data=np.array([ex.n_variants for ex, _ in pairs], dtype=np.int32))
            for name in ("episode_id", "basin_id", "agent"):
                f.create_dataset(name, data=[getattr(ex, name) for ex, _ in pairs], dtype=string)
        install_file(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("wrote %s: %d sequences, %d tokens", out, len(trajs), int(offsets[-1]))


# ---------------------------------------------------------------------------------------------
# The conversational JSON Lines form (Hugging Face datasets / TRL; train/sft/hf_data.py)


def _same(a: Trajectory, b: Trajectory) -> bool:
    return (list(a.input_ids) == list(b.input_ids) and list(a.assistant_mask) == list(b.assistant_mask)
            and [tuple(x) for x in a.spans] == [tuple(x) for x in b.spans])


def _builder(builders: dict[str, TrajectoryBuilder], tokenizer: Any, tools: list[dict[str, Any]] | None
             ) -> TrajectoryBuilder:
    key = json.dumps(tools, sort_keys=True)
    return builders.get(key) or builders.setdefault(key, TrajectoryBuilder(tokenizer, tools=tools))


def _is_prefix(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) <= len(b) and b[:len(a)] == a


def _tokenise_records(tokenizer: Any, records: Sequence[hf_data.Record]) -> list[Trajectory]:
    """The trajectory of each record, built as :class:`TrajectoryBuilder` builds it alone, but once per run of
    consecutive records whose conversations are prefixes of the run's last one (an episode's stopping-point
    variants): the builder is exact-prefix, so a prefix ending at assistant turn ``j`` is the first
    ``spans[j][1]`` ids of the longest one (the variants of :func:`_variants`). :class:`SFTDataError` names the
    record whose conversation cannot be built."""
    builders: dict[str, TrajectoryBuilder] = {}
    out: list[Trajectory] = []
    i = 0
    while i < len(records):
        j = i
        while (j + 1 < len(records) and records[j + 1].tools == records[i].tools
               and _is_prefix(records[j].messages, records[j + 1].messages)):
            j += 1
        last = records[j]
        try:
            full = _builder(builders, tokenizer, last.tools).build(last.messages)
        except TrajectoryError as exc:
            where = last.where if i == j else f"{records[i].where} to {last.where}"
            raise SFTDataError(f"{where}: {exc.message}", fix=exc.fix) from None
        for rec in records[i:j + 1]:
            c = sum(1 for m in rec.messages if m.get("role") == "assistant")
            end = full.spans[c - 1][1]
            out.append(Trajectory(full.input_ids[:end], full.assistant_mask[:end], full.spans[:c],
                                  full.message_index[:c], ""))
        i = j + 1
    return out


def export_hf_dataset(built: Sequence[tuple[Any, Trajectory]], folder: str | os.PathLike[str], tokenizer: Any, *,
                      data_file: str | os.PathLike[str], report: SFTDataReport, tokenizer_name: str = "") -> Path:
    """Write the examples of a build (each with its conversation and trajectory) into ``folder`` as
    ``train.jsonl`` (one conversational record per example, :mod:`hydroagent_hpc.train.sft.hf_data`) and
    a dataset card ``README.md``; both atomically. Every record is read back and tokenised the way
    :func:`import_hf_dataset` does, and must give its example's ids, mask and spans exactly (else
    :class:`SFTDataError`, nothing written): the export is lossless by construction."""
    folder = Path(folder)
    data_file = Path(data_file)
    if folder.exists() and not folder.is_dir():
        raise SFTDataError(f"--export-hf {folder}: is a file, not a folder", fix="give a folder (a new one is made)")

    def render(messages: list[dict[str, Any]]) -> str:
        text: str = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        return text

    lines: list[str] = []
    back: list[hf_data.Record] = []
    calls = texts = 0
    for i, (ex, _) in enumerate(built):
        record = hf_data.to_record(
            ex.messages, ex.tools, render, weight=float(ex.weight), episode_id=ex.episode_id,
            best_nse=None if ex.best_nse is None or not math.isfinite(ex.best_nse) else float(ex.best_nse),
            variant=int(ex.variant), n_variants=int(ex.n_variants), basin_id=ex.basin_id, agent=ex.agent)
        line = hf_data.record_line(record)
        back.append(hf_data.parse_record(f"{folder / hf_data.DATA_FILE}:{i + 1}", json.loads(line)))
        for m in record["messages"]:
            if m["role"] == "assistant":
                calls, texts = calls + ("tool_calls" in m), texts + ("tool_calls" not in m)
        lines.append(line)
    for i, (again, (ex, traj)) in enumerate(zip(_tokenise_records(tokenizer, back), built)):
        if not _same(again, traj):
            raise SFTDataError(f"example {i} (episode {ex.episode_id}): its conversational record does not tokenise "
                               f"to the same ids; nothing was exported",
                               fix="report this: the export must be lossless for this chat template")
    folder.mkdir(parents=True, exist_ok=True)
    hf_data.write_text_atomic(folder / hf_data.DATA_FILE, iter(lines))
    card = _dataset_card(report, data_file, tokenizer_name, len(lines), calls, texts)
    hf_data.write_text_atomic(folder / hf_data.CARD_FILE, card)
    log.info("exported %d examples to %s (%d assistant messages with tool_calls, %d as text)", len(lines),
             folder / hf_data.DATA_FILE, calls, texts)
    return folder


def _dataset_card(r: SFTDataReport, data_file: Path, tokenizer_name: str, n: int, calls: int, texts: int) -> str:
    """The dataset card (README.md) of an export: what, how it was built, checksums, columns, loading."""
    columns = "\n".join(f"| `{k}` | {v} |" for k, v in hf_data.COLUMNS.items())
    sources = "\n".join(f"- `{s['path']}` (sha256 `{s['sha256']}`, {s['episodes']} episodes)" for s in r.sources)
    built = (f"`hydroagent train sft-data` with preset `{r.preset}` ({_WEIGHTING.get(r.preset, '')}), augment "
             f"`{r.augment}`, render `{r.render}`, error recovery p={r.recovery:g} (seed {r.recovery_seed}, "
             f"{r.recovery_turns} corrupted calls), tokenizer `{tokenizer_name}`, max_tokens "
             f"{r.lengths.get('budget')}") if r.preset != IMPORTED else "`hydroagent train sft-import`"
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: {hf_data.DATA_FILE}
tags:
- sft
- tool-calling
- hydrology
---

# Teacher trajectories for calibrating CREST/EF5 (hydroagent-hpc SFT data)

{n} conversational examples ({r.kept} episodes) of agents calibrating the CREST/EF5 hydrologic model
with tool calls, each with its training weight. The same examples, token for token, as the SFT data
file `{data_file.name}` (sha256 `{file_sha256(data_file)}`): tokenising a record's `messages` with
`tools` through the chat template, as `hydroagent train sft-import` does, gives that file's ids and
assistant mask exactly ({calls} assistant messages carry `tool_calls`, {texts} keep their text: an
error-recovery corruption, or text the template would not give back identically).

## How it was built

{built}, from:

{sources}

git commit `{git_commit()}`, written {datetime.now(timezone.utc).isoformat(timespec="seconds")}.

## Columns

| column | what |
|---|---|
{columns}

## Loading

```python
from datasets import load_dataset
ds = load_dataset("json", data_files="{hf_data.DATA_FILE}", split="train")
# TRL: SFTTrainer(model=..., train_dataset=ds, ...) reads messages and tools; weight and
# train_mask are this project's per-example weight and per-message loss mask.
```

Back to an SFT data file: `hydroagent train sft-import FOLDER --out DATA.h5 --tokenizer MODEL`.
"""


def import_hf_dataset(src: str | os.PathLike[str], out: str | os.PathLike[str], *, tokenizer: Any = "tiny",
                      max_tokens: int = 16384, tokenizer_name: str | None = None) -> SFTDataReport:
    """A conversational data set (a JSON Lines file, or a folder of ``*.jsonl`` files; the format of
    :mod:`hydroagent_hpc.train.sft.hf_data`) -> an SFT data file ``out`` (preset ``imported``), each
    record tokenised with ``tokenizer``'s chat template by the builder :func:`build_sft_data` uses, with
    its ``weight`` and ``train_mask``. Records are checked strictly first (one line naming the file,
    line and field); sequences over ``max_tokens`` are refused; ``out`` is written atomically."""
    src, out = Path(src), Path(out)
    if int(max_tokens) < 1:
        raise SFTDataError(f"--max-tokens {max_tokens}: must be at least 1")
    try:
        records = hf_data.read_records(src)
    except hf_data.HFDataError as exc:
        raise SFTDataError(exc.message, fix=exc.fix) from None
    if not sum(r.weight for r in records) > 0:
        raise SFTDataError(f"{src}: every weight is 0: nothing would be learned", fix="give some record a weight > 0")
    if isinstance(tokenizer, str):
        tokenizer_name = tokenizer_name or tokenizer
        tokenizer = load_tokenizer(tokenizer)
    tokenizer_name = tokenizer_name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    built: list[tuple[_Example, Trajectory]] = []
    too_long: list[str] = []
    for rec, traj in zip(records, _tokenise_records(tokenizer, records)):
        if len(traj) > max_tokens:
            too_long.append(f"{rec.where} ({len(traj)} tokens)")
        ex = _Example(rec.episode_id, rec.basin_id, rec.agent, 0, rec.best_nse, rec.weight, rec.variant,
                      rec.n_variants, rec.messages, rec.tools)
        built.append((ex, traj))
    if too_long:
        raise SFTDataError(f"{len(too_long)} records exceed --max-tokens {max_tokens}: {', '.join(too_long[:10])}; "
                           f"nothing was written (sequences are never truncated)",
                           fix="raise --max-tokens, or drop those records")
    files = [src] if src.is_file() else sorted(p for p in src.glob("*.jsonl") if p.is_file())
    sources = [{"path": str(p.resolve()), "sha256": file_sha256(p), "episodes": len({ex.episode_id for ex, _ in built})}
               for p in files]
    episodes = {ex.episode_id: (dataclasses.replace(ex, weight=0.0), None) for ex, _ in built}
    for ex, _ in built:
        episodes[ex.episode_id][0].weight += ex.weight
    report = _report(out, IMPORTED, list(episodes.values()), built,  # type: ignore[arg-type]
                     defaultdict(Counter), sources, max_tokens, "none", "none", 0.0, Counter(), 0)
    _write(out, built, report, tokenizer_name)
    log.info("imported %d records of %s into %s", len(built), src, out)
    return report


# ---------------------------------------------------------------------------------------------
# Reading


#: The schema versions :class:`SFTDataset` reads: 1 (before augmentation: no ``variant`` /
#: ``n_variants``) and :data:`DATA_VERSION`.
KNOWN_VERSIONS = (1, DATA_VERSION)
#: The datasets every data file holds (``variant``, ``n_variants``, ``best_nse``, ``source``,
#: ``basin_id`` and ``agent`` are optional: the trainer does not need them).
REQUIRED_DATASETS = ("input_ids", "assistant_mask", "offsets", "spans", "span_offsets", "weight", "episode_id")
_REBUILD = "rebuild it with `hydroagent train sft-data --from STORE.h5 --out DATA.h5`"
_CHUNK = 1 << 22  # tokens read at once when the whole file is checked


class _DataCheck:
    """The whole-file check of an SFT data file (:meth:`SFTDataset.__init__` runs it before anything
    trains): every error names the file, the dataset and the example (row) that is wrong."""

    def __init__(self, path: Path, f: h5py.File) -> None:
        self.path, self.f = path, f
        self.episode_ids: list[str] = []

    def fail(self, what: str, row: int | None = None) -> SFTDataError:
        at = ""
        if row is not None:
            eid = self.episode_ids[row] if 0 <= row < len(self.episode_ids) else None
            at = f" (example {row}" + (f", episode {eid}" if eid else "") + ")"
        return SFTDataError(f"{self.path}: {what}{at}; it is never trained on", fix=_REBUILD)

    def read(self, name: str, kind: str, ndim: int = 1) -> np.ndarray:
        """Dataset ``name`` whole, refused unless it has ``ndim`` dimensions and numbers of ``kind`` (i, u, f)."""
        if name not in self.f:
            raise self.fail(f"dataset {name} is missing")
        ds = self.f[name]
        if not isinstance(ds, h5py.Dataset) or ds.ndim != ndim or ds.dtype.kind not in kind:
            shape = getattr(ds, "shape", None)
            dtype = getattr(ds, "dtype", None)
            raise self.fail(f"dataset {name} is {dtype} of shape {shape}, expected a {ndim}-D array of "
                            f"{'whole numbers' if 'f' not in kind else 'numbers'}")
        try:
            out: np.ndarray = ds[()]
        except (OSError, RuntimeError, ValueError) as exc:
            raise self.fail(f"dataset {name} cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
        return out

    def index(self, name: str, n: int, end: int, of: str, *, strict: bool) -> np.ndarray:
        """An offsets array into dataset ``of``: ``n + 1`` entries from 0 to ``end`` (its length), increasing
        (``strict``: no empty entry)."""
        a = self.read(name, "iu").astype(np.int64)
        if len(a) != n + 1:
            raise self.fail(f"dataset {name} holds {len(a)} entries, expected {n + 1} (one more than the {n} "
                            f"examples)")
        if a[0] != 0:
            raise self.fail(f"{name}[0] is {a[0]}, not 0", 0)
        step = np.diff(a)
        bad = np.flatnonzero(step <= 0 if strict else step < 0)
        if bad.size:
            i = int(bad[0])
            word = "increase" if strict else "decrease"
            raise self.fail(f"{name} does not {word} at entry {i + 1} ({a[i]} then {a[i + 1]})", i)
        if a[-1] != end:
            raise self.fail(f"{name}[{n}] is {a[-1]}, but dataset {of} holds {end} entries", n - 1)
        return a

    def run(self) -> dict[str, Any]:
        f = self.f
        if f.attrs.get("schema") != DATA_SCHEMA:
            raise SFTDataError(f"{self.path}: not an SFT data file (schema {f.attrs.get('schema')!r})",
                               fix="build it with `hydroagent train sft-data`")
        version = f.attrs.get("schema_version")
        if isinstance(version, np.generic):
            version = version.item()
        if isinstance(version, bool) or not isinstance(version, int) or version not in KNOWN_VERSIONS:
            raise SFTDataError(f"{self.path}: schema_version {version!r} is not one this version reads "
                               f"({', '.join(map(str, KNOWN_VERSIONS))})",
                               fix="rebuild it with this version's `hydroagent train sft-data`")
        for name in REQUIRED_DATASETS:
            if name not in f:
                raise self.fail(f"dataset {name} is missing")
        weights = self.read("weight", "fiu").astype(np.float64)
        n = len(weights)
        ids = self.read("episode_id", "OSU")
        if len(ids) != n:
            raise self.fail(f"dataset episode_id holds {len(ids)} entries, weight {n}")
        self.episode_ids = [v.decode() if isinstance(v, bytes) else str(v) for v in ids]
        if n == 0:
            raise self.fail("holds no example")
        bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
        if bad.size:
            i = int(bad[0])
            raise self.fail(f"weight[{i}] is {weights[i]!r}: a weight must be a finite number >= 0", i)
        with np.errstate(over="ignore"):
            total = float(weights.sum())
        if not total > 0 or not math.isfinite(total):
            raise self.fail(f"the weights sum to {total!r}: nothing would be learned" if total == 0 else
                            f"the weights sum to {total!r}, beyond what a float holds")
        extra: dict[str, np.ndarray] = {}
        for name in ("variant", "n_variants"):
            if name in f:
                extra[name] = self.read(name, "iu")
                if len(extra[name]) != n:
                    raise self.fail(f"dataset {name} holds {len(extra[name])} entries, weight {n}")
        n_tokens = self._tokens_length()
        offsets = self.index("offsets", n, n_tokens, "input_ids", strict=True)
        spans = self.read("spans", "iu", ndim=2).astype(np.int64)
        if spans.ndim != 2 or spans.shape[1:] != (2,):
            raise self.fail(f"dataset spans has shape {spans.shape}, expected (turns, 2)")
        span_offsets = self.index("span_offsets", n, len(spans), "spans", strict=False)
        lengths = np.diff(offsets)
        row_of_span = np.repeat(np.arange(n), np.diff(span_offsets))
        bad = np.flatnonzero((spans[:, 0] < 0) | (spans[:, 0] >= spans[:, 1]) | (spans[:, 1] > lengths[row_of_span]))
        if bad.size:
            j = int(bad[0])
            row = int(row_of_span[j])
            raise self.fail(f"spans[{j}] = [{spans[j, 0]}, {spans[j, 1]}) is not a turn inside its sequence of "
                            f"{lengths[row]} tokens", row)
        top, top_row, weighted = self._tokens(offsets, weights)
        if weighted == 0:
            raise self.fail("no assistant token (assistant_mask 1) of an example with a weight above 0: "
                            "nothing would be learned")
        return {"weights": weights, "offsets": offsets, "span_offsets": span_offsets, "n": n, "extra": extra,
                "max_token": top, "max_token_row": top_row}

    def _tokens_length(self) -> int:
        for name in ("input_ids", "assistant_mask"):
            ds = self.f[name]
            if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind not in "iu":
                raise self.fail(f"dataset {name} is {getattr(ds, 'dtype', None)} of shape {getattr(ds, 'shape', None)}"
                                f", expected a 1-D array of whole numbers")
        n_ids, n_mask = len(self.f["input_ids"]), len(self.f["assistant_mask"])
        if n_ids != n_mask:
            raise self.fail(f"dataset assistant_mask holds {n_mask} entries, input_ids {n_ids}")
        return n_ids

    def _tokens(self, offsets: np.ndarray, weights: np.ndarray) -> tuple[int, int, int]:
        """Token ids >= 0 and mask values 0/1, read in chunks; (largest id, its example, weighted mask-1 tokens)."""
        ids_ds, mask_ds = self.f["input_ids"], self.f["assistant_mask"]
        top, top_row, weighted = -1, -1, 0
        token_weight = np.repeat(weights > 0, np.diff(offsets))
        for a in range(0, len(ids_ds), _CHUNK):
            b = min(a + _CHUNK, len(ids_ds))
            try:
                ids = ids_ds[a:b].astype(np.int64)
                mask = mask_ds[a:b]
            except (OSError, RuntimeError, ValueError) as exc:
                raise self.fail(f"tokens {a}..{b} cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
            for name, bad in (("input_ids", ids < 0), ("assistant_mask", (mask != 0) & (mask != 1))):
                if bad.any():
                    k = a + int(np.flatnonzero(bad)[0])
                    value = ids[k - a] if name == "input_ids" else mask[k - a]
                    what = "a token id below 0" if name == "input_ids" else "neither 0 nor 1"
                    raise self.fail(f"{name}[{k}] is {value}: {what}", self.row(offsets, k))
            if ids.size and int(ids.max()) > top:
                k = a + int(ids.argmax())
                top, top_row = int(ids[k - a]), self.row(offsets, k)
            weighted += int(np.count_nonzero((mask == 1) & token_weight[a:b]))
        return top, top_row, weighted

    @staticmethod
    def row(offsets: np.ndarray, token: int) -> int:
        """The example that token position ``token`` belongs to."""
        return int(np.searchsorted(offsets, token, side="right")) - 1


class SFTDataset(Dataset[dict[str, Any]]):
    """A data file of :func:`build_sft_data` as a ``torch.utils.data.Dataset``.

    Item ``i``: ``input_ids`` (int64), ``assistant_mask`` (int64, 1 on model-written tokens),
    ``weight`` (float32 scalar), ``spans`` (int64 ``[turns, 2]``) and ``episode_id`` (the source
    episode). ``variants`` / ``n_variants`` hold each example's variant index and its episode's
    number of variants (0 / 1 for files written before augmentation). The index arrays are read
    once; token slices are read on demand from a handle opened per process (safe with forked
    ``DataLoader`` workers).

    The whole file is checked when it is opened, so nothing bad is ever trained on: a known schema
    version, every dataset present with its shape, ``offsets`` and ``span_offsets`` from 0,
    increasing, ending at the data they address, every span inside its sequence, token ids >= 0
    (:meth:`check_vocabulary` checks them against a model), mask values 0/1, one finite weight
    >= 0 per example, not all 0, and some weighted assistant token. :class:`SFTDataError` names the
    file, the dataset and the example (row).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise SFTDataError(f"{self.path}: no such SFT data file",
                               fix="build it with `hydroagent train sft-data --from STORE.h5 --out DATA.h5`")
        try:
            f = h5py.File(self.path, "r")
        except OSError as exc:
            raise SFTDataError(f"{self.path}: not a readable HDF5 file ({str(exc)[:120]}); it is never trained on",
                               fix=_REBUILD) from None
        with f:
            check = _DataCheck(self.path, f)
            found = check.run()
            self.offsets = found["offsets"]
            self.span_offsets = found["span_offsets"]
            self.weights = found["weights"]
            self.episode_ids = check.episode_ids
            n = found["n"]  # files before augmentation: one full variant per episode
            self.variants = found["extra"].get("variant", np.zeros(n, np.int32))
            self.n_variants = found["extra"].get("n_variants", np.ones(n, np.int32))
            self.max_token_id, self._max_token_row = int(found["max_token"]), int(found["max_token_row"])
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        self._f: h5py.File | None = None
        self._pid = -1

    def check_vocabulary(self, vocab: int, model: str = "the model") -> None:
        """Refuse token ids at or above ``vocab`` (the model's embedding rows), naming the example."""
        if self.max_token_id >= vocab:
            row = self._max_token_row
            raise SFTDataError(f"{self.path}: token id {self.max_token_id} is outside the vocabulary of {vocab} of "
                               f"{model} (example {row}, episode {self.episode_ids[row]}; data tokenizer "
                               f"{self.attrs.get('tokenizer')!r}); it is never trained on",
                               fix="build the data with the model's own tokenizer")

    def __len__(self) -> int:
        return len(self.weights)

    def _file(self) -> h5py.File:
        if self._f is None or self._pid != os.getpid():
            self._f = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._f

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"{self.path}: item {i} of {len(self)}")
        i = i % len(self)
        f = self._file()
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        s, e = int(self.span_offsets[i]), int(self.span_offsets[i + 1])
        return {"input_ids": torch.from_numpy(f["input_ids"][a:b].astype(np.int64)),
                "assistant_mask": torch.from_numpy(f["assistant_mask"][a:b].astype(np.int64)),
                "weight": torch.tensor(float(self.weights[i]), dtype=torch.float32),
                "spans": torch.from_numpy(f["spans"][s:e]), "episode_id": self.episode_ids[i]}

    def info(self, name: str) -> Any:
        """A root attribute, JSON attributes decoded (``sources``, ``counts``, ``weights``, ...)."""
        v = self.attrs[name]
        return json.loads(v) if name in ("sources", "counts", "dropped", "weights", "lengths", "recovery_kinds") else v

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_f"], state["_pid"] = None, -1
        return state
