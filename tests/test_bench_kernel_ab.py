"""The kernel A/B tool: two builds on the same captured arguments, their bits compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.ckernel import needs_c
from hydroagent_hpc.bench import kernel_ab
from hydroagent_hpc.sim import ckernel

ROOT = Path(__file__).resolve().parents[1]
CONTROL = ROOT / "tests" / "data" / "ef5-reference" / "dendritic" / "control_a.txt"


pytestmark = needs_c


def test_the_same_source_twice_is_identical(capsys):
    assert kernel_ab.main(["--old", str(ckernel.SOURCE), "--repeats", "1", str(CONTROL)]) == 0
    out = capsys.readouterr().out
    assert "| control_a" not in out  # the case is named by its folder
    row = next(ln for ln in out.splitlines() if ln.startswith("| dendritic"))
    assert row.rstrip().endswith("| yes |")


def test_a_kernel_that_moves_a_bit_is_reported_and_fails(tmp_path, capsys):
    src = ckernel.SOURCE.read_text()
    assert "const float beta_over = 0.6f;" in src
    changed = tmp_path / "changed.c"
    changed.write_text(src.replace("const float beta_over = 0.6f;", "const float beta_over = 0.61f;"))
    assert kernel_ab.main(["--old", str(ckernel.SOURCE), "--new", str(changed), "--repeats", "1", "--batch", "2",
                           str(CONTROL)]) == 1
    assert "| NO |" in capsys.readouterr().out


def test_an_unknown_revision_is_a_clear_error():
    with pytest.raises(SystemExit, match="neither a file nor a git revision"):
        kernel_ab.main(["--old", "no-such-revision-xyz", str(CONTROL)])
