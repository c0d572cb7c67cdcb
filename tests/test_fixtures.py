"""The fixtures in tests/data are complete and unchanged, and a missing one fails instead of skipping."""

from __future__ import annotations

import hashlib

import pytest

from conftest import ROOT, TEST_DATA, require


def test_every_listed_fixture_is_present_and_unchanged():
    listed = (TEST_DATA / "SHA256SUMS").read_text().splitlines()
    assert len(listed) > 600  # every golden case and the CAMELS subset
    bad = []
    for line in listed:
        digest, name = line.split(maxsplit=1)
        path = TEST_DATA / name.lstrip("*")
        if not path.is_file():
            bad.append(f"{name}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            bad.append(f"{name}: changed")
    assert not bad, "restore with `git checkout -- tests/data`:\n" + "\n".join(bad)


def test_a_missing_fixture_fails_and_says_how_to_restore_it():
    missing = TEST_DATA / "camels" / "no_such_basin.txt"
    with pytest.raises(pytest.fail.Exception) as err:
        require(missing)
    text = str(err.value)
    assert "tests/data/camels/no_such_basin.txt is missing" in text
    assert "git checkout -- tests/data/camels/no_such_basin.txt" in text
    assert require(ROOT / "tests" / "conftest.py") == ROOT / "tests" / "conftest.py"
