"""The child processes of the tests keep the caller's PYTHONPATH (a cluster's module system lives there)."""

from __future__ import annotations

import os

from helpers.paths import ROOT, pythonpath


def test_the_given_folders_then_the_checkout_then_the_callers_entries_each_once(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/site/a", "", str(ROOT), "/site/b"]))
    assert pythonpath(tmp_path).split(os.pathsep) == [str(tmp_path), str(ROOT), "/site/a", "/site/b"]
    monkeypatch.delenv("PYTHONPATH")
    assert pythonpath() == str(ROOT)
