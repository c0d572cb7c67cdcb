"""Control-file templates with ``{placeholder}`` fields (see ``ef5/templates/``).

Filling is strict because values may come from configs or from a model's tool call: numbers must
be finite and are written with ``repr``; text values (paths, ids) must be single tokens with no
white space, brackets, ``=`` or comment markers, so nothing can add a key or a section. Every
placeholder must be given and every given value must be used.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Mapping

__all__ = ["TEMPLATE_DIR", "placeholders", "fill_template"]

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "ef5" / "templates"
_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_./:+\-]+$")


def placeholders(text: str) -> set[str]:
    """Placeholder names used outside comment lines."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(_FIELD.findall(body))


def _render(name: str, value) -> str:
    if isinstance(value, bool):
        raise ValueError(f"template field {name!r}: a boolean is not allowed")
    if isinstance(value, (int, float)):
        if not math.isfinite(float(value)):
            raise ValueError(f"template field {name!r}: {value!r} is not finite")
        return repr(value) if isinstance(value, int) else repr(float(value))
    text = str(value)
    if not _SAFE_TEXT.match(text) or "//" in text:
        raise ValueError(f"template field {name!r}: {text!r} must be one token of letters, digits and ._/:+- "
                         "(no spaces, '=', brackets or comment markers)")
    return text


def fill_template(template: str | Path, values: Mapping[str, object]) -> str:
    """The template's text with every ``{field}`` replaced; comment lines are dropped."""
    text = Path(template).read_text() if isinstance(template, Path) or "\n" not in str(template) else str(template)
    needed = placeholders(text)
    missing = sorted(needed - set(values))
    extra = sorted(set(values) - needed)
    if missing:
        raise ValueError(f"template needs values for: {', '.join(missing)}")
    if extra:
        raise ValueError(f"template has no field(s): {', '.join(extra)}")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    rendered = {k: _render(k, v) for k, v in values.items()}
    return "\n".join(_FIELD.sub(lambda m: rendered[m.group(1)], line) for line in lines).strip() + "\n"
