"""One token-exact trajectory builder for SFT, GRPO and the local policy (rl-notes.md section 1).

A conversation (system, user, assistant, tool messages) becomes **one id sequence**, built the
way a policy meets it at inference time, turn by turn:

```
prompt ids      everything before assistant turn k, rendered with the generation prompt   mask 0
model ids       what the model wrote in turn k, up to and including its end token        mask 1
suffix ids      template glue ("\\n" after <|im_end|>) + tool responses + next
                generation prompt                                                        mask 0
...
```

Exact prefix. For each assistant turn ``k`` the conversation up to it is rendered with the
generation prompt; the text already held (everything up to the end token of turn ``k-1``) must
be a text prefix of that rendering, and only the new suffix is tokenised and appended. So the ids
of turn ``k`` are by construction a prefix of the ids of turn ``k+1``, and a template that
rewrites history (strips earlier reasoning, renumbers, re-serialises earlier tool calls) is
refused with :class:`TemplatePrefixError` naming the turn and the first differing character,
instead of silently training on tokens that inference never sees.

Masks come from token spans, not from ``{% generation %}`` markers (stock Qwen3 templates lack
them): the model's part of turn ``k`` is the rendering of the conversation through message ``k``
(no generation prompt) minus the rendering before it, cut after the first end token. The text
before the end token is the assistant content (and, for OpenAI-style ``tool_calls``, the
``<tool_call>`` blocks the template writes for them); it is tokenised on its own, exactly as a
policy's sampled ids follow the generation prompt ids. Glue after the end token goes to the next
mask-0 suffix. Trailing messages after the last assistant turn carry no loss and are left out.

Untrained turns. An assistant message with the key ``"train": False`` is rendered and tokenised
like any other (same ids, same span, so the exact-prefix property holds), but its ids get mask 0:
the model reads it as context and is never taught to write it. The SFT data builder's
error-recovery turns use it for a deliberately corrupted call (:mod:`hydroagent_hpc.train.sft.data`).
The key is removed before the template sees the messages; absent or ``True`` it changes nothing.
Any other value, or the key on a message that is not an assistant message, is refused.

Where this lives: ``agents/llm`` so :class:`~hydroagent_hpc.agents.llm.hf_local.HFLocalPolicy`
uses it without ``agents`` importing ``train``; the trainers (SFT data, GRPO rollouts) import it from
here. It needs only a tokenizer object (``apply_chat_template``, ``encode``), so
importing it loads neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydroagent_hpc.errors import HydroAgentError

__all__ = ["Trajectory", "TrajectoryBuilder", "TrajectoryError", "TemplatePrefixError", "common_prefix",
           "END_TOKEN"]

#: The token that ends a Qwen/ChatML assistant turn; the model writes it, so it is mask 1.
END_TOKEN = "<|im_end|>"


class TrajectoryError(HydroAgentError, ValueError):
    """A conversation that cannot become a token-exact trajectory (the message says which turn)."""


class TemplatePrefixError(TrajectoryError):
    """The chat template rendered earlier turns differently once a later turn was added."""


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Trajectory:
    """``input_ids`` and ``assistant_mask`` (1 exactly on model-written tokens) of one conversation.

    ``spans[j] = (start, end)``: the ids ``input_ids[start:end]`` the model wrote in assistant turn
    ``j`` (its content, tool-call blocks and end token); ``message_index[j]`` is that turn's
    position in the messages. ``text`` is the rendered text the ids encode piecewise. A turn marked
    ``"train": False`` keeps its span, but its ids are mask 0 (see the module doc).
    """

    input_ids: list[int] = field(default_factory=list)
    assistant_mask: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    message_index: list[int] = field(default_factory=list)
    text: str = ""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_assistant_tokens(self) -> int:
        return int(sum(self.assistant_mask))


class TrajectoryBuilder:
    """Turns conversations into :class:`Trajectory` objects with ``tokenizer``'s chat template.

    ``tools``: the tool schemas the template renders into the system turn (None: no tools block).
    ``chat_template`` overrides the tokenizer's. ``end_token`` ends an assistant turn (default
    ``<|im_end|>``, else the tokenizer's eos).
    """

    def __init__(self, tokenizer: Any, tools: Sequence[dict] | None = None, chat_template: str | None = None,
                 end_token: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] if tools is not None else None
        self.chat_template = chat_template
        if end_token is None:
            vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
            end_token = END_TOKEN if END_TOKEN in vocab else tokenizer.eos_token
        if not end_token:
            raise TrajectoryError("the tokenizer has neither <|im_end|> nor an eos token: cannot tell where an "
                                  "assistant turn ends", fix="pass end_token=... to TrajectoryBuilder")
        self.end_token = str(end_token)

    # ------------------------------------------------------------------ pieces (shared with HFLocalPolicy)
    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as the template writes it, with this builder's tools."""
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  chat_template=self.chat_template)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with no special tokens added (a special token in the text stays one id)."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def suffix(self, held: str, rendered: str, turn: int) -> str:
        """``rendered`` minus the ``held`` text it must start with; :class:`TemplatePrefixError` if not."""
        if rendered.startswith(held):
            return rendered[len(held):]
        at = common_prefix(held, rendered)
        raise TemplatePrefixError(
            f"assistant turn {turn}: the chat template rewrote history: the rendering up to this turn does "
            f"not start with the text of the turns before it (first difference at character {at}: held "
            f"{held[max(0, at - 30):at + 30]!r}, new {rendered[max(0, at - 30):at + 30]!r})",
            fix="use a prefix-stable template (no stripping or re-rendering of earlier turns; see "
                "hydroagent_hpc.train.tiny.CHAT_TEMPLATE), or pass chat_template=...")

    def model_part(self, before: str, through: str, turn: int) -> str:
        """What the model wrote in a turn: ``through`` (rendered through the assistant message, no
        generation prompt) minus ``before`` (rendered before it, with the generation prompt), up to
        and including the first end token."""
        part = self.suffix(before, through, turn)
        cut = part.find(self.end_token)
        if cut < 0:
            raise TrajectoryError(f"assistant turn {turn}: the template wrote no {self.end_token} after the "
                                  f"assistant message ({part[:80]!r}...)",
                                  fix="use a ChatML template (Qwen) or pass end_token=...")
        return part[:cut + len(self.end_token)]

    # ------------------------------------------------------------------ the builder
    def build(self, messages: Sequence[dict[str, Any]], encode: Callable[[str], list[int]] | None = None
              ) -> Trajectory:
        """The token-exact :class:`Trajectory` of ``messages`` (see the module doc).

        Raises :class:`TrajectoryError` when there is no assistant message, when an assistant
        message contains the end token itself, when a ``train`` key is not a bool on an assistant
        message, and :class:`TemplatePrefixError` when the template rewrites history.
        """
        enc = encode or self.encode
        msgs = [dict(m) for m in messages]
        trained = [True] * len(msgs)
        for i, m in enumerate(msgs):
            if "train" not in m:
                continue
            flag = m.pop("train")
            if m.get("role") != "assistant" or not isinstance(flag, bool):
                raise TrajectoryError(f"message {i} ({m.get('role')!r}): \"train\": {flag!r} is only for assistant "
                                      f"messages and must be true or false",
                                      fix="mark only assistant messages, with \"train\": False to mask one")
            trained[i] = flag
        turns = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
        if not turns:
            raise TrajectoryError("the conversation has no assistant message: nothing to learn from",
                                  fix="pass a conversation with at least one assistant turn")
        out = Trajectory()
        for k, i in enumerate(turns):
            content = msgs[i].get("content")
            if isinstance(content, str) and self.end_token in content:
                raise TrajectoryError(f"assistant turn {k} (message {i}) contains {self.end_token} in its text; "
                                      f"a model cannot write past its end token",
                                      fix="cut the message at the end token before building")
            rendered = self.render(msgs[:i], add_generation_prompt=True)
            prompt = self.suffix(out.text, rendered, k)
            model = self.model_part(rendered, self.render(msgs[:i + 1], add_generation_prompt=False), k)
            prompt_ids, model_ids = enc(prompt), enc(model)
            out.input_ids += prompt_ids
            out.assistant_mask += [0] * len(prompt_ids)
            start = len(out.input_ids)
            out.input_ids += model_ids
            out.assistant_mask += [1 if trained[i] else 0] * len(model_ids)
            out.spans.append((start, len(out.input_ids)))
            out.message_index.append(i)
            out.text = rendered + model
        return out
