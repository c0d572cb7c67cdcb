"""A tiny random Qwen3 model, a tokenizer trained on the spot, and a Qwen-style chat template.

Everything here is built offline in well under a second on a CPU (docs/rl-notes.md, section 8), so
tests of the local policy, the SFT and the GRPO trainers exercise the real Hugging Face code
paths (``AutoModelForCausalLM``, ``apply_chat_template``, ``generate``, ``save_pretrained`` /
``from_pretrained``) without the hub:

- :func:`build_tiny_tokenizer`: a byte-level BPE trained with ``tokenizers`` on synthetic
  calibration text (:func:`synthetic_corpus`: Hermes set_parameters calls, NSE observations,
  the system prompts, prose). The Qwen control tokens (:data:`SPECIAL_TOKENS`) are registered as
  special, so each is one id and tool-call tags can be found by token. eos is ``<|im_end|>``,
  pad is ``<|endoftext|>`` (pad != eos on purpose, TRL #4974), padding is on the left (for
  generation; trainers right-pad themselves).
- :data:`CHAT_TEMPLATE`: Qwen3-Instruct's layout with tools, without thinking blocks (see its
  docstring-comment below); assistant text and its ``<|im_end|>`` sit inside
  ``{% generation %}`` so ``return_assistant_tokens_mask=True`` works for SFT masks.
- :func:`build_tiny_qwen3`: ``Qwen3ForCausalLM`` with the sizes of docs/rl-notes.md section 8 (0.92 M
  parameters with the default 1024-token vocabulary), sized from ``len(tokenizer)``,
  initialised from a seed without touching the global RNG.
- :func:`save_tiny` / :func:`load_tiny`: a ``save_pretrained`` folder (config, generation
  config, safetensors, tokenizer files, ``chat_template.jinja``) and its offline reload.

The model is random: it writes garbage, which the environment turns into parse failures. That
is what a test of the plumbing wants; a test that needs valid calls forces tokens (see
``tests/test_hf_local.py``) or trains the model for a few steps.

torch, tokenizers and transformers are imported here (and in ``agents/hf_local.py``) only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hydroagent_hpc.env import prompts
from hydroagent_hpc.env.toolcalls import render_hermes, render_tool_response, tool_schemas
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.types import ToolCall

__all__ = ["SPECIAL_TOKENS", "EOS_TOKEN", "PAD_TOKEN", "CHAT_TEMPLATE", "TINY_QWEN3_SIZES", "synthetic_corpus",
           "build_tiny_tokenizer", "build_tiny_qwen3", "build_tiny", "save_tiny", "load_tiny"]

#: Qwen's control tokens, registered as special (single ids, never split by BPE).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

#: docs/rl-notes.md section 8; ``vocab_size`` comes from the tokenizer.
TINY_QWEN3_SIZES = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 32768}

# A Qwen3-Instruct-2507-style template (docs/rl-notes.md section 2), written to be prefix-stable:
# - with tools, the system turn is the system message, a blank line, then "# Tools" and one JSON
#   schema per line inside <tools> ... </tools>, then the Hermes call instruction;
# - turns are <|im_start|>{role}\n{content}<|im_end|>\n; the generation prompt is
#   <|im_start|>assistant\n;
# - assistant content is rendered verbatim (no <think> stripping, no branch on loop.last), and
#   OpenAI-style ``tool_calls`` become <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
#   blocks serialised as toolcalls.render_hermes does;
# - consecutive ``tool`` messages share one user turn, each as <tool_response>\n...\n</tool_response>.
# A conversation rendered with the generation prompt after any complete tool group (what
# run_episode hands a policy) is therefore an exact text prefix of every later rendering.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {{- content }}
            {%- if message.tool_calls %}
                {%- for tool_call in message.tool_calls %}
                    {%- if (loop.first and content) or (not loop.first) %}
                        {{- '\n' }}
                    {%- endif %}
                    {%- if tool_call.function %}
                        {%- set tool_call = tool_call.function %}
                    {%- endif %}
                    {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                    {%- if tool_call.arguments is string %}
                        {{- tool_call.arguments }}
                    {%- else %}
                        {{- tool_call.arguments | tojson }}
                    {%- endif %}
                    {{- '}\n</tool_call>' }}
                {%- endfor %}
            {%- endif %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 (the template's fixed system text stays on one line each, as Qwen's own template has it)

_PROSE = (
    "The simulated peaks are too low, so I will lower wm to produce more runoff.",
    "The simulated peaks arrive too late; increasing alpha should speed up the channel routing.",
    "The volume ratio is above one, which means too much water leaves the basin; I will raise wm.",
    "The recession is too steep compared with the observed hydrograph, so I will reduce leaki.",
    "NSE improved from the previous run. Next I will adjust the interflow speed under.",
    "Baseflow is underestimated; a smaller fc keeps more water in the soil.",
    "The simulation finished. Now I will evaluate it against the observed discharge.",
    "KGE shows a bias in the mean flow, so the runoff volume must change before the timing.",
    "Peak timing is good but the peak magnitude is too high; b controls the shape of the infiltration curve.",
    "I will start from the default multipliers and run a first simulation.",
    "The best NSE so far is below the target, so I continue to calibrate.",
    "Let me set the parameters, run the simulation and evaluate the result.",
)


def synthetic_corpus(n_lines: int = 900, seed: int = 0) -> list[str]:
    """Lines of calibration text to train the tiny tokenizer on (deterministic for a seed).

    Tool schemas, both presets' system prompts, the template's fixed text, Hermes calls with
    random in-bounds values, compact JSON observations with metrics, and hydrologist's prose;
    ``n_lines`` of the generated kinds after the fixed ones.
    """
    rng = np.random.default_rng(seed)
    lines: list[str] = [json.dumps(s, ensure_ascii=False) for s in tool_schemas()]
    for preset in prompts.PRESETS:
        for protocol in ("turns", "rounds"):
            lines += prompts.system_prompt(preset, {"protocol": protocol}).split("\n")
    lines += ["# Tools", "You may call one or more functions to assist with the user query.",
              "You are provided with function signatures within <tools></tools> XML tags:",
              "For each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:", "system", "user", "assistant",
              "Calibrate the CREST model for USGS gauge 02338660.", "- Drainage area: 80 km²",
              "- Time step: 1 hour", "- Scored window: 2021-07-04 to 2021-07-11"]
    metric_keys = ("NSE", "KGE", "KGE_r", "KGE_alpha", "KGE_beta", "RMSE", "PBIAS", "volume_ratio", "peak_lag_h")
    for i in range(n_lines):
        kind = i % 4
        if kind == 0:
            names = rng.choice(TUNABLE, size=int(rng.integers(1, 5)), replace=False)
            args = {str(n): round(float(rng.uniform(PARAMS[n].lower, PARAMS[n].upper)), int(rng.integers(1, 4)))
                    for n in names}
            lines.append(render_hermes(ToolCall("set_parameters", args)))
        elif kind == 1:
            lines.append(render_hermes(ToolCall(str(rng.choice(["run_simulation", "evaluate"])), {})))
        elif kind == 2:
            obs = {"status": "ok", "run": int(rng.integers(1, 50))}
            obs.update({k: round(float(rng.normal(0.3, 0.5)), 4) for k in metric_keys})
            obs["improved"] = bool(rng.integers(0, 2))
            obs["target_nse"] = 0.8
            lines.append(render_tool_response(obs))
        else:
            lines.append(str(rng.choice(_PROSE)))
    return lines


def build_tiny_tokenizer(corpus_lines: Iterable[str] | None = None, *, vocab_size: int = 1024,
                         chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus_lines`` (default :func:`synthetic_corpus`).

    The default corpus fills the 1024 ids asked for, but the BPE trainer stops below
    ``vocab_size`` on a smaller corpus (459 ids in docs/rl-notes.md section 8): size models from
    ``len(tokenizer)``, never from ``vocab_size``. Any text encodes (byte-level alphabet) and
    decodes back unchanged; :data:`SPECIAL_TOKENS` are the single special ids 0..6. Training is
    deterministic: the same lines give the same vocabulary.
    """
    lines = list(corpus_lines) if corpus_lines is not None else synthetic_corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN,
                                                                                                     PAD_TOKEN)],
                                   padding_side="left", clean_up_tokenization_spaces=False,
                                   model_max_length=TINY_QWEN3_SIZES["max_position_embeddings"])
    fast.chat_template = chat_template
    return fast


def build_tiny_qwen3(tokenizer: PreTrainedTokenizerFast, seed: int = 0, **overrides: int) -> Qwen3ForCausalLM:
    """A random ``Qwen3ForCausalLM`` for ``tokenizer`` (sizes :data:`TINY_QWEN3_SIZES`, ``overrides`` win).

    Weights depend only on ``seed`` and the sizes; the global torch RNG is left as it was. The
    generation config carries eos/pad only (no sampling defaults), in float32 on the CPU.
    """
    sizes: dict[str, Any] = {**TINY_QWEN3_SIZES, **overrides}
    config = Qwen3Config(vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model.eval()
    return model


def build_tiny(seed: int = 0,
               corpus_lines: Sequence[str] | None = None) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """``(model, tokenizer)``: :func:`build_tiny_tokenizer` then :func:`build_tiny_qwen3`."""
    tokenizer = build_tiny_tokenizer(corpus_lines)
    return build_tiny_qwen3(tokenizer, seed=seed), tokenizer


def save_tiny(path: str | os.PathLike[str], model: PreTrainedModel | None = None,
              tokenizer: PreTrainedTokenizerFast | None = None, seed: int = 0) -> Path:
    """Write a ``from_pretrained``-loadable folder (builds the model and tokenizer if not given)."""
    if tokenizer is None:
        tokenizer = build_tiny_tokenizer()
    if model is None:
        model = build_tiny_qwen3(tokenizer, seed=seed)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_tiny(path: str | os.PathLike[str],
              dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from a :func:`save_tiny` folder, from local files only."""
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    model.eval()
    return model, tokenizer
