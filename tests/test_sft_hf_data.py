"""SFT data as a conversational JSON Lines data set and back (train/sft/hf_data.py, data.py
export_hf_dataset / import_hf_dataset, ``hydroagent train sft-data --export-hf``, ``train sft-import``).

Real parts: a real heuristic campaign (with a scripted agent whose calls carry prose) on the session's
synthetic basin, the tiny tokenizer's chat template, real HDF5 and JSON Lines files, and Hugging Face
``datasets`` loading the export.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from hydroagent_hpc.campaign import load_campaign, run_campaign
from hydroagent_hpc.cli import main
from hydroagent_hpc.train import tiny
from hydroagent_hpc.train.sft import hf_data
from hydroagent_hpc.train.sft.data import SFTDataError, SFTDataset, build_sft_data, import_hf_dataset


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def store(tmp_path_factory, small_basin_dir):
    tmp = tmp_path_factory.mktemp("hf")
    spec = tmp / "c.yaml"
    spec.write_text(f"name: c\nbasins: [{small_basin_dir}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                    "seeds: [0, 1]\n"
                    "env: {preset: paper, max_simulations: 3, max_turns: null, patience: null, target_nse: 0.99}\n")
    out = tmp / "c.h5"
    run_campaign(load_campaign(spec), out, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def exported(store, tok, tmp_path_factory):
    """A released-preset build with stopping-point variants and error-recovery turns, exported."""
    tmp = tmp_path_factory.mktemp("export")
    report = build_sft_data([store], tmp / "sft.h5", preset="released", augment="stopping_points", recovery=0.5,
                            recovery_seed=3, tokenizer=tok, tokenizer_name="tiny", max_tokens=100_000,
                            export_hf=tmp / "hf")
    return {"h5": tmp / "sft.h5", "dir": tmp / "hf", "report": report}


def _examples(path: Path) -> list[tuple[list[int], list[int], list[list[int]], float, str]]:
    ds = SFTDataset(path)
    out = []
    for i in range(len(ds)):
        item = ds[i]
        out.append((item["input_ids"].tolist(), item["assistant_mask"].tolist(), item["spans"].tolist(),
                    float(item["weight"]), item["episode_id"]))
    return out


def _lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / hf_data.DATA_FILE).read_text().splitlines()]


def test_export_then_import_gives_the_same_tokens_and_weights(exported, tok, tmp_path):
    back = tmp_path / "back.h5"
    import_hf_dataset(exported["dir"], back, tokenizer=tok, tokenizer_name="tiny", max_tokens=100_000)
    a, b = _examples(exported["h5"]), _examples(back)
    assert len(a) == len(b) == exported["report"].examples > 2
    assert a == b  # ids, mask, spans, weight (float64 through JSON), episode id
    with h5py.File(exported["h5"]) as f, h5py.File(back) as g:
        for name in ("weight", "variant", "n_variants", "best_nse"):
            assert np.array_equal(f[name][()], g[name][()], equal_nan=True), name
        assert g.attrs["preset"] == "imported"
    records = _lines(exported["dir"])
    assert exported["report"].recovery_turns > 0
    calls = [m for r in records for m in r["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
    masked = [m for r in records for m, keep in zip(r["messages"], r["train_mask"]) if m["role"] == "assistant"
              and not keep]
    assert calls and masked  # the teacher's calls are structured; the corrupted copies stay text, untrained
    assert all("tool_calls" not in m for m in masked)
    fn = calls[0]["tool_calls"][0]["function"]
    assert isinstance(fn["arguments"], str) and isinstance(json.loads(fn["arguments"]), dict) and fn["name"]
    assert "<tool_call>" not in calls[0]["content"]
    assert {m["role"] for r in records for m in r["messages"]} == {"system", "user", "assistant", "tool"}
    assert all(r["messages"][-1]["role"] == "assistant" for r in records)  # a variant ends at its cut
    assert [r["variant"] for r in records][:3] == [0, 1, 2] and min(r["n_variants"] for r in records) > 1


def test_the_export_loads_with_datasets_and_renders_the_original_text(exported, tok):
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(exported["dir"] / hf_data.DATA_FILE), split="train")
    assert len(ds) == exported["report"].examples
    assert {"messages", "tools", "train_mask", "weight", "episode_id", "best_nse"} <= set(ds.column_names)
    row = ds[len(ds) - 1]
    tools = json.loads(row["tools"])
    assert [t["function"]["name"] for t in tools][:1] and isinstance(tools[0]["function"]["parameters"], dict)
    # what TRL's SFTTrainer does with a row: the chat template over messages and tools
    text = tok.apply_chat_template(row["messages"], tools=tools, tokenize=False)
    ids = SFTDataset(exported["h5"])[len(ds) - 1]["input_ids"].tolist()
    assert text.startswith(tok.decode(ids[:50])) and "<tool_call>\n{\"name\": " in text
    card = (exported["dir"] / hf_data.CARD_FILE).read_text()
    from hydroagent_hpc.sim.manifest import file_sha256

    assert file_sha256(exported["h5"]) in card and "`weight`" in card and "preset `released`" in card


def test_cli_export_hf_and_sft_import(store, tmp_path, capsys):
    assert main(["train", "sft-data", "--from", str(store), "--out", str(tmp_path / "a.h5"), "--preset", "released",
                 "--max-tokens", "100000", "--export-hf", str(tmp_path / "hf")]) == 0
    assert json.loads(capsys.readouterr().out)["export_hf"] == str(tmp_path / "hf")
    assert main(["train", "sft-import", str(tmp_path / "hf" / hf_data.DATA_FILE), "--out", str(tmp_path / "b.h5"),
                 "--max-tokens", "100000"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == len(_lines(tmp_path / "hf"))
    assert _examples(tmp_path / "a.h5") == _examples(tmp_path / "b.h5")


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": {"name": "evaluate", "arguments": {}}}]}]}


@pytest.mark.parametrize("row, said", [
    ("{not json", "2: not JSON"),
    ([1], "2: the line is a JSON list"),
    ({"messages": []}, "2: messages: must be a non-empty list"),
    ({**GOOD, "colour": 1}, "2: unknown field 'colour'"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "2: messages[0].role: 'robot'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "2: messages: no assistant message"),
    ({"messages": [{"role": "assistant", "content": 3}]}, "2: messages[0].content: must be a string"),
    ({**GOOD, "weight": -1}, "2: weight: must be a finite number >= 0"),
    ({**GOOD, "weight": "1"}, "2: weight: must be a finite number"),
    ({**GOOD, "train_mask": [True, True]}, "2: train_mask[0]: true on a user message"),
    ({**GOOD, "train_mask": [False]}, "2: train_mask: must be a list of 2 booleans"),
    ({**GOOD, "tools": "[oops"}, "2: tools: not JSON text"),
    ({"messages": [GOOD["messages"][0], {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "evaluate", "arguments": "[1]"}}]}]},
     "2: messages[1].tool_calls[0].function.arguments: the JSON text is a list"),
    ({"messages": [GOOD["messages"][0], {"role": "assistant", "content": "", "tool_calls": [{"name": "x"}]}]},
     "2: messages[1].tool_calls[0].function: must be an object"),
])
def test_bad_records_are_one_line_naming_file_line_and_field(tmp_path, tok, row, said):
    src = _write(tmp_path / "d.jsonl", [GOOD, row])
    with pytest.raises(SFTDataError) as err:
        import_hf_dataset(src, tmp_path / "out.h5", tokenizer=tok)
    message = err.value.message
    assert message.startswith(f"{src}:") and said in message and "\n" not in message, message
    assert not (tmp_path / "out.h5").exists()


def test_a_foreign_record_with_object_arguments_imports_and_masks_as_told(tmp_path, tok):
    rows = [GOOD, {**GOOD, "weight": 0.25, "train_mask": [False, False], "episode_id": "x"},
            {**GOOD, "weight": 0.5}]
    out = tmp_path / "d.h5"
    import_hf_dataset(_write(tmp_path / "d.jsonl", rows), out, tokenizer=tok)
    ex = _examples(out)
    assert [w for *_, w, _ in ex] == [1.0, 0.25, 0.5]
    assert sum(ex[0][1]) > 0 and sum(ex[1][1]) == 0 and ex[0][0] == ex[1][0]
    assert ex[0][4] == f"{tmp_path / 'd.jsonl'}:1" and ex[1][4] == "x"
    text = tok.decode(ex[0][0])
    assert '<tool_call>\n{"name": "evaluate", "arguments": {}}\n</tool_call>' in text


def test_split_calls_takes_only_text_the_template_writes_back():
    two = ('hi\n<tool_call>\n{"name": "x", "arguments": {"a": 1}}\n</tool_call>\n'
           '<tool_call>\n{"name": "y", "arguments": {}}\n</tool_call>')
    assert hf_data.split_calls(two) == ("hi", [{"type": "function", "function": {"name": "x", "arguments": '{"a": 1}'}},
                                               {"type": "function", "function": {"name": "y", "arguments": "{}"}}])
    assert hf_data.split_calls('<tool_call>\n{"name": "x", "arguments": {"a":1}}\n</tool_call>')[1][0][
        "function"]["arguments"] == '{"a":1}'  # the model's own spacing, kept
    for text in ('hi <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>',  # no newline before the block
                 '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call> bye',  # prose after it
                 '<tool_call>\n{"name": "x", "arguments": {"a": 1}, "arguments": {}}\n</tool_call>',
                 '<tool_call>\n{"name": "x", "name": "x", "arguments": {}}\n</tool_call>',
                 '<tool_call>\n{"name": "x", "arguments": []}\n</tool_call>', "no call at all"):
        assert hf_data.split_calls(text) is None, text


def test_a_template_that_writes_calls_otherwise_keeps_the_text(tok):
    msgs = [{"role": "user", "content": "u"},
            {"role": "assistant", "content": 'ok\n<tool_call>\n{"name": "evaluate", "arguments": {}}\n</tool_call>'}]

    def render_with(template):
        return lambda ms: tok.apply_chat_template(ms, tokenize=False, chat_template=template)

    same = hf_data.to_record(msgs, None, render_with(tiny.CHAT_TEMPLATE))
    assert same["messages"][1]["tool_calls"][0]["function"]["name"] == "evaluate"
    other = tiny.CHAT_TEMPLATE.replace("'}\\n</tool_call>'", "'}</tool_call>'")
    assert other != tiny.CHAT_TEMPLATE
    kept = hf_data.to_record(msgs, None, render_with(other))
    assert kept["messages"][1] == msgs[1] and kept["train_mask"] == [False, True]


def test_records_that_extend_each_other_are_built_once_and_sliced_exactly(exported, tok, tmp_path):
    from hydroagent_hpc.agents.llm.trajectory import TrajectoryBuilder

    records = _lines(exported["dir"])
    first = records[0]  # variant 0 of the first episode: a prefix of the variants after it
    assert first["variant"] == 0 and records[1]["messages"][:len(first["messages"])] == first["messages"]
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(first) + "\n")
    import_hf_dataset(alone, tmp_path / "alone.h5", tokenizer=tok, max_tokens=100_000)
    chained = tmp_path / "chain.jsonl"
    chained.write_text("".join(json.dumps(r) + "\n" for r in records[:3]))
    import_hf_dataset(chained, tmp_path / "chain.h5", tokenizer=tok, max_tokens=100_000)
    assert _examples(tmp_path / "alone.h5")[0] == _examples(tmp_path / "chain.h5")[0]
    rec = hf_data.read_records(alone)[0]
    built = TrajectoryBuilder(tok, tools=rec.tools).build(rec.messages)
    assert _examples(tmp_path / "chain.h5")[0][:2] == (built.input_ids, built.assistant_mask)


@pytest.mark.slow  # TRL's import and trainer set-up: ~8 s on 2 shared cores
def test_trl_sft_trainer_reads_the_export_and_trains_a_step(exported, tmp_path):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import SFTConfig, SFTTrainer

    model, tok = tiny.build_tiny()
    ds = datasets.load_dataset("json", data_files=str(exported["dir"] / hf_data.DATA_FILE), split="train")
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=1, report_to=[],
                     save_strategy="no", max_length=None, use_cpu=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    ours = SFTDataset(exported["h5"])
    for i in (0, len(ds) - 1):  # TRL renders the whole conversation: our ids, then the template's final "\n"
        theirs = trainer.train_dataset[i]["input_ids"]
        assert theirs[:-1] == ours[i]["input_ids"].tolist() and tok.decode(theirs[-1:]) == "\n"
    assert np.isfinite(trainer.train().training_loss)
