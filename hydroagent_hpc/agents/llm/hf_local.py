"""A local Hugging Face causal LM (Qwen3-Instruct and alike) as a calibration policy.

:class:`HFLocalPolicy` speaks the :class:`~hydroagent_hpc.agents.base.Policy` protocol: given the
conversation (system, user, assistant, tool messages), it renders the next prompt with the
tokenizer's chat template, the three tool schemas and the generation prompt, generates, and
returns the new text up to the stop token. Hermes ``<tool_call>`` blocks survive decoding
(special tokens are kept; only the stop token is cut), and the environment parses them.

Stop tokens. A turn ends at ``<|im_end|>`` (or eos / ``<|endoftext|>``) and, with
``stop_at_tool_call=True`` (the default), also at ``</tool_call>`` when the tokenizer has it as
one token (Qwen tokenizers and :mod:`hydroagent_hpc.train.tiny`'s do; otherwise only the end
tokens stop, logged once). So the model never goes on to write its own ``<tool_response>``: the
environment answers the call. A turn that ends at ``</tool_call>`` keeps that tag in its text
(it is part of the call); the policy then appends the ``<|im_end|>`` id to the held sequence as
template glue (mask 0: it was not sampled), so the held ids stay exactly the rendering of the
conversation (the trajectory builder's ids, where that im_end is mask 1 because a teacher wrote
it). ``finish_reason`` is "stop" for both; ``TurnTrace.stop_token`` says which token ended the
turn and ``TurnTrace.glue_ids`` holds the appended id. The usage ``completion_tokens`` count
sampled ids only; ``context_tokens`` is the length of the held sequence, glue included.

Token-exact sequences (docs/rl-notes.md section 1). The policy keeps the episode as **one id
sequence**: the first prompt, then per turn the sampled ids (including the ``<|im_end|>`` the
model emitted) and the ids of the template glue + tool responses + next generation prompt. Only
that suffix is tokenised each turn (it is the rendered conversation minus the text already
held, which a prefix-stable template guarantees); the sampled ids are never re-tokenised, so
the model is conditioned on exactly what it sampled. The render / exact-prefix / suffix steps are
those of :class:`~hydroagent_hpc.agents.llm.trajectory.TrajectoryBuilder` (``policy.builder``),
which SFT and GRPO use to build their sequences. If a new rendering does not extend the held
text (a template that rewrites history, or a caller that edits messages), the policy re-renders
the whole conversation, logs a warning and marks the turn ``rerendered``. ``policy.trace`` holds
per turn the fed ``prompt_ids`` and the sampled ``completion_ids`` (mask 0 / mask 1 for GRPO);
:meth:`HFLocalPolicy.token_sequence` returns the current ids and that mask.

Sampling. ``temperature`` and ``top_p`` (defaults 1.0 / 0.95, HydroAgent's GRPO rollouts),
``top_k`` 0 = off; ``greedy=True`` for evaluation (the authors' evaluation was greedy). Every
decoding setting is explicit: the checkpoint's ``generation_config.json`` sampling defaults
(Qwen3 ships top_k 20, top_p 0.8, temperature 0.7) and transformers' global ``top_k=50`` are
not applied behind the caller's back. Turn ``k`` of an episode samples under the seed derived
from ``(seed, k)`` in a forked RNG, so the same seed gives the same episode and the global
torch RNG is never touched; rollouts of one GRPO group take different seeds.

Context budget. Each turn needs ``prompt + max_new_tokens <= max_context_tokens`` (defaults
6144 + 2048 = 8192, the authors' evaluation engine; capped by the model's
``max_position_embeddings``). When the next prompt would overflow, :meth:`act` returns ``None``
(the episode ends, "policy_stopped"), logs why and sets ``policy.stop_reason`` to
``"context_length: ..."``. Nothing is ever dropped from the conversation: the authors' loop
dropped messages from index 1 on, so the **user prompt** went first (docs/reference-implementation.md
section 4); a calibration episode without its task is not one we want to score.

Usage. ``policy.usage`` (reset at the first turn of each episode): ``prompt_tokens`` (summed
over turns, as an API would bill), ``new_prompt_tokens`` (ids actually fed beyond the previous
turn), ``completion_tokens``, ``total_tokens``, ``context_tokens`` (length of the sequence),
``turns``, ``length_truncated`` (turns cut by ``max_new_tokens``), ``wall_s``, ``stop_reason``
and ``per_turn`` rows.

torch and transformers are imported lazily (only when a policy is built), so this module can be
imported without them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hydroagent_hpc.agents.llm.trajectory import TemplatePrefixError, TrajectoryBuilder
from hydroagent_hpc.env import toolcalls
from hydroagent_hpc.errors import CannotHealError
from hydroagent_hpc.params import ParameterSet

log = logging.getLogger(__name__)

__all__ = ["HFLocalPolicy", "TurnTrace", "turn_seed", "TOOL_CALL_END", "ModelLoadError"]

#: The closing tag of a Hermes tool call; with ``stop_at_tool_call`` a turn also ends there.
TOOL_CALL_END = "</tool_call>"

_MASK63 = (1 << 63) - 1


class ModelLoadError(CannotHealError):
    """A checkpoint (folder or hub id) that does not load: no later episode can load it either, so a
    campaign stops at once with this one line, which names the path, why and the fix."""

    def __init__(self, source: str, exc: BaseException) -> None:
        why = " ".join(str(exc).split())[:300] or type(exc).__name__
        if isinstance(exc, MemoryError) or "out of memory" in why.lower():
            fix = "free memory on the device, or choose one with more (the agent's device option)"
        elif not os.path.exists(source) and (os.path.isabs(source) or source.startswith(".")
                                             or source.count("/") != 1):
            fix = f"give the checkpoint folder that exists (path: {source!r} is not there)"
        else:
            fix = (f"check that {source} is a complete checkpoint (config.json, the tokenizer's files and the "
                   "*.safetensors weights, fully copied); a hub id needs the hub or its local cache")
        super().__init__(f"model {source} does not load: {type(exc).__name__}: {why}", f"{fix}, then rerun")
        self.source = source


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of an episode run with ``seed`` (a 63-bit integer)."""
    state = np.random.SeedSequence([int(seed) & _MASK63, int(turn)]).generate_state(2, dtype=np.uint32)
    return ((int(state[0]) << 32) | int(state[1])) & _MASK63


@dataclass
class TurnTrace:
    """The ids of one turn. ``prompt_ids`` were fed and not sampled (mask 0): the whole prompt at
    turn 0 (or after a re-render), else the template glue, tool responses and generation prompt.
    ``completion_ids`` were sampled (mask 1), ending with the stop token when one was sampled
    (``finish_reason`` "stop") and without one when ``max_new_tokens`` cut the turn ("length").
    ``seed`` is the turn's sampling seed (None when greedy). ``stop_token`` is the token that ended
    the turn (``"<|im_end|>"``, ``"</tool_call>"``, ...; None for "length"); ``glue_ids`` are ids
    appended after the completion as template glue (mask 0): the ``<|im_end|>`` that closes a turn
    stopped at ``</tool_call>``."""

    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    finish_reason: str
    rerendered: bool = False
    seed: int | None = None
    stop_token: str | None = None
    glue_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HFLocalPolicy:
    """A ``transformers`` causal LM that writes the assistant messages of a calibration episode.

    ``model``: a local folder or hub id (loaded with ``AutoModelForCausalLM`` / ``AutoTokenizer``;
    set ``HF_HUB_OFFLINE=1`` where there is no hub), or a model object, with the tokenizer given
    by ``tokenizer`` or as ``(model, tokenizer)``. ``device`` "auto" picks CUDA when available
    (a model object stays where it is); ``dtype`` "auto" is bfloat16 on CUDA, float32 on CPU.
    ``tools`` defaults to :func:`hydroagent_hpc.env.toolcalls.tool_schemas` (pass
    ``tool_schemas(clip_out_of_bounds=...)`` matching the environment's config).
    ``chat_template`` overrides the tokenizer's. ``logits_processors`` are appended to the
    sampling chain (constrained decoding; tests force tokens with one). ``keep_trace=False``
    skips :attr:`trace` (the id sequence itself is always kept: generation needs it).
    ``stop_at_tool_call`` (default True) also ends a turn at ``</tool_call>`` (see the module doc);
    False keeps the old behaviour (only ``<|im_end|>``/eos stop).
    """

    # the episode's state, (re)set by _new_episode
    _ids: list[int]  # the held token sequence (prompt and sampled ids since the last re-render)
    _mask: list[int]  # 1 on sampled ids
    _text: str  # the text of _ids
    _turn: int  # the assistant turn _ids ends with (-1 before the first)
    stop_reason: str | None
    trace: list[TurnTrace]
    usage: dict[str, Any]

    def __init__(self, model: Any, tokenizer: Any = None, *, name: str | None = None, temperature: float = 1.0,
                 top_p: float = 0.95, top_k: int = 0, greedy: bool = False, max_new_tokens: int = 2048,
                 max_context_tokens: int = 8192, seed: int = 0, device: str = "auto", dtype: Any = "auto",
                 tools: Sequence[dict] | None = None, chat_template: str | None = None,
                 logits_processors: Sequence[Any] = (), keep_trace: bool = True,
                 stop_at_tool_call: bool = True) -> None:
        import torch  # noqa: F401  (fail early and clearly where torch is missing)

        if not greedy and not temperature > 0:
            raise ValueError(f"temperature={temperature!r}: must be > 0 when sampling (use greedy=True for argmax)")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p={top_p!r}: must be in (0, 1]")
        if top_k < 0 or max_new_tokens < 1 or max_context_tokens < 2:
            raise ValueError("top_k must be >= 0, max_new_tokens >= 1 and max_context_tokens >= 2")
        if isinstance(model, tuple):
            model, tokenizer = model
        self.model, self.tokenizer, source = _load(model, tokenizer, device, dtype)
        self.name = name or f"hf:{os.path.basename(str(source).rstrip('/')) or source}"
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.greedy = bool(greedy)
        self.max_new_tokens = int(max_new_tokens)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_context_tokens = int(min(max_context_tokens, limit) if limit else max_context_tokens)
        self.seed = int(seed)
        self._default_tools = tools is None  # then use_parameters may add a basin's Snow-17 parameters
        self.tools = [dict(t) for t in (tools if tools is not None else toolcalls.tool_schemas())]
        self.chat_template = chat_template
        self.builder = TrajectoryBuilder(self.tokenizer, self.tools, chat_template)
        self.logits_processors = list(logits_processors)
        self.keep_trace = bool(keep_trace)
        end_ids = _stop_ids(self.tokenizer)
        self.im_end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.im_end_id is None or self.im_end_id == self.tokenizer.unk_token_id:
            self.im_end_id = self.tokenizer.eos_token_id
        self.stop_at_tool_call = bool(stop_at_tool_call)
        self.tool_call_end_id = _single_token_id(self.tokenizer, TOOL_CALL_END) if self.stop_at_tool_call else None
        if self.stop_at_tool_call and self.tool_call_end_id is None:
            log.info("%s: %s is not a single token of this tokenizer; turns stop at the end token only",
                     self.name, TOOL_CALL_END)
        self.stop_ids = end_ids + ((self.tool_call_end_id,) if self.tool_call_end_id is not None
                                   and self.tool_call_end_id not in end_ids else ())
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        self._new_episode()

    # ------------------------------------------------------------------ public
    def use_parameters(self, parameters: ParameterSet) -> None:
        """The basin's parameter set (run_episode calls this before the episode).

        With the default tools, the schema in the prompt then lists the basin's parameters (the
        Snow-17 ones on a basin with snow); tools given to the constructor are kept as they are.
        """
        if not self._default_tools:
            return
        tools = toolcalls.tool_schemas(parameters=parameters)
        if tools != self.tools:
            self.tools = tools
            self.builder = TrajectoryBuilder(self.tokenizer, self.tools, self.chat_template)

    @property
    def settings(self) -> dict[str, Any]:
        """The decoding settings, for the episode record."""
        return {"model": self.name, "greedy": self.greedy, "temperature": None if self.greedy else self.temperature,
                "top_p": None if self.greedy else self.top_p, "top_k": None if self.greedy else self.top_k,
                "max_new_tokens": self.max_new_tokens, "max_context_tokens": self.max_context_tokens,
                "seed": self.seed, "device": str(self.model.device), "dtype": str(self.model.dtype).split(".")[-1]}

    def act(self, messages: list[dict[str, Any]]) -> str | None:
        """The next assistant message (text with Hermes tool calls), or ``None`` to stop (context full)."""
        t0 = time.perf_counter()
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn == 0:
            self._new_episode()
        text = self._render(messages)
        rerendered = False
        suffix = None
        if turn > 0 and self._ids and turn == self._turn + 1:
            try:  # the same exact-prefix step as the SFT/GRPO trajectory builder
                suffix = self.builder.suffix(self._text, text, turn)
            except TemplatePrefixError:
                suffix = None
        if suffix is not None:
            new_ids = self._encode(suffix)
            ids = self._ids + new_ids
        else:
            if turn > 0:
                rerendered = True
                log.warning("%s: turn %d does not extend the held sequence (template rewrote history or the "
                            "messages changed); re-rendering the whole conversation", self.name, turn)
            self._ids, self._mask = [], []
            new_ids = self._encode(text)
            ids = new_ids
        if len(ids) + self.max_new_tokens > self.max_context_tokens:
            self.stop_reason = (f"context_length: prompt {len(ids)} + max_new_tokens {self.max_new_tokens} > "
                                f"max_context_tokens {self.max_context_tokens} at turn {turn}")
            self.usage["stop_reason"] = self.stop_reason
            log.info("%s stops the episode: %s", self.name, self.stop_reason)
            return None
        seed = None if self.greedy else turn_seed(self.seed, turn)
        completion = self._generate(ids, seed)
        finish = "stop" if completion and completion[-1] in self.stop_ids else "length"
        stop_token = None
        glue: list[int] = []
        body = completion
        if finish == "stop":
            stop_token = self.tokenizer.convert_ids_to_tokens(completion[-1])
            if completion[-1] == self.tool_call_end_id:
                glue = [int(self.im_end_id)]  # the call is part of the text; im_end closes the turn (mask 0)
            else:
                body = completion[:-1]
        reply = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)

        self._ids = ids + completion + glue
        self._mask = self._mask + [0] * len(new_ids) + [1] * len(completion) + [0] * len(glue)
        ends_turn = finish == "stop" and (glue or completion[-1] == self.im_end_id)
        self._text = text + reply + ("<|im_end|>" if ends_turn else "")
        self._turn = turn
        wall = time.perf_counter() - t0
        self._count(turn, len(ids), len(new_ids), len(completion), finish, wall, len(self._ids))
        if self.keep_trace:
            self.trace.append(TurnTrace(turn, list(new_ids), list(completion), finish, rerendered, seed, stop_token,
                                        glue))
        return reply

    def token_sequence(self) -> tuple[list[int], list[int]]:
        """``(ids, mask)`` of the episode so far (since the last re-render): mask 1 on sampled ids."""
        return list(self._ids), list(self._mask)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as the policy's template writes it (with its tools)."""
        return self._render(messages, add_generation_prompt)

    # ------------------------------------------------------------------ internals
    def _new_episode(self) -> None:
        self._ids = []
        self._mask = []
        self._text = ""
        self._turn = -1
        self.stop_reason = None
        self.trace = []
        self.usage = {"model": self.name, "turns": 0, "prompt_tokens": 0, "new_prompt_tokens": 0,
                                      "completion_tokens": 0, "total_tokens": 0, "context_tokens": 0,
                                      "length_truncated": 0, "wall_s": 0.0, "stop_reason": None, "per_turn": []}

    def _count(self, turn: int, prompt: int, new: int, completion: int, finish: str, wall: float,
               context: int) -> None:
        u = self.usage
        u["turns"] += 1
        u["prompt_tokens"] += prompt
        u["new_prompt_tokens"] += new
        u["completion_tokens"] += completion
        u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        u["context_tokens"] = context
        u["length_truncated"] += finish == "length"
        u["wall_s"] += wall
        u["per_turn"].append({"turn": turn, "prompt_tokens": prompt, "new_prompt_tokens": new,
                              "completion_tokens": completion, "finish_reason": finish, "wall_s": round(wall, 6)})

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.builder.render(messages, add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.builder.encode(text)

    def _generation_config(self):
        from transformers import GenerationConfig

        common = {"max_new_tokens": self.max_new_tokens, "eos_token_id": list(self.stop_ids),
                  "pad_token_id": self.pad_id, "bos_token_id": None, "num_beams": 1, "use_cache": True,
                  "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
        if self.greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                **common)

    def _generate(self, ids: list[int], seed: int | None) -> list[int]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        device = self.model.device
        inputs = torch.tensor([ids], dtype=torch.long, device=device)
        saved = self.model.generation_config
        # The checkpoint's sampling defaults must not fill what we left unset (see module doc).
        self.model.generation_config = GenerationConfig(eos_token_id=list(self.stop_ids), pad_token_id=self.pad_id,
                                                        bos_token_id=None)
        try:
            with torch.inference_mode(), _seeded(seed, device):
                out = self.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                                          generation_config=self._generation_config(),
                                          logits_processor=LogitsProcessorList(self.logits_processors))
        finally:
            self.model.generation_config = saved
        new = out[0, len(ids):].tolist()
        if new and new[-1] in self.stop_ids:
            return new
        for i, tok in enumerate(new):  # batch of one: nothing after the stop token, but be exact
            if tok in self.stop_ids:
                return new[: i + 1]
        return new


@contextlib.contextmanager
def _seeded(seed: int | None, device):
    """Seed torch's generator(s) for one generate call and restore their state afterwards."""
    import torch

    if seed is None:
        yield
        return
    cuda = device.type == "cuda"
    index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else None)
    with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda" if cuda else None):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


def _stop_ids(tokenizer) -> tuple[int, ...]:
    """``<|im_end|>`` (or eos) first, then ``<|endoftext|>`` when it is a distinct token."""
    ids = []
    for tok in ("<|im_end|>", tokenizer.eos_token, "<|endoftext|>"):
        if tok is None:
            continue
        i = tokenizer.convert_tokens_to_ids(tok)
        if i is not None and i != tokenizer.unk_token_id and i not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError("the tokenizer has neither <|im_end|> nor an eos token: cannot tell where a turn ends")
    return tuple(ids)


def _single_token_id(tokenizer, token: str) -> int | None:
    """The id of ``token`` when the tokenizer has it as one token (and encodes it as that one id)."""
    i = tokenizer.convert_tokens_to_ids(token)
    if i is None or i == tokenizer.unk_token_id:
        return None
    if list(tokenizer.encode(token, add_special_tokens=False)) != [i]:
        return None
    return int(i)


def _load(model: Any, tokenizer: Any, device: str, dtype: Any):
    """``(model, tokenizer, source)`` from a path/hub id or from objects."""
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = os.fspath(model)
        dev = _device(device)
        try:
            tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(source)
            mdl = AutoModelForCausalLM.from_pretrained(source, dtype=_dtype(dtype, dev), device_map=str(dev))
        except Exception as exc:  # any reason a checkpoint does not load (files, format, memory) stops the run
            raise ModelLoadError(source, exc) from exc
        return mdl.eval(), tok, source
    if tokenizer is None:
        raise ValueError("a model object needs its tokenizer: HFLocalPolicy(model, tokenizer) or "
                         "HFLocalPolicy((model, tokenizer))")
    if device != "auto":
        model = model.to(_device(device))
    if dtype != "auto":
        model = model.to(_dtype(dtype, model.device))
    source = getattr(model.config, "name_or_path", "") or type(model).__name__
    return model.eval(), tokenizer, source


def _device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _dtype(dtype: Any, device):
    import torch

    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, str):
        value = getattr(torch, dtype, None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"dtype={dtype!r}: not a torch dtype (e.g. 'float32', 'bfloat16')")
        return value
    return dtype
