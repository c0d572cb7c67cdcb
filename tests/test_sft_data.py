"""Teacher data (train/sft/data.py, ``hydroagent train sft-data``) from real campaign stores.

A small real campaign on the session's synthetic basin: the heuristic hydrologist (two step
sizes), a scripted agent that ruins the fit (text, final NSE far below 0.6) and DDS (no text).
Stores, episodes, templates and tokenizer are real; nothing is mocked.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hydroagent_hpc.agents.llm.trajectory import TrajectoryBuilder  # noqa: E402
from hydroagent_hpc.campaign import load_campaign, run_campaign  # noqa: E402
from hydroagent_hpc.store import read_episodes, read_turns  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.train.sft.data import SFTDataError, SFTDataset, build_sft_data, episode_messages, paper_weights  # noqa: E402

ENV = "env: {preset: paper, max_simulations: 3, max_turns: null, patience: null, target_nse: 0.99}\n"


def _campaign(tmp: Path, basin: Path, name: str, agents: str, seeds: str) -> Path:
    spec = tmp / f"{name}.yaml"
    spec.write_text(f"name: {name}\nbasins: [{basin}]\nagents:\n{agents}\nseeds: {seeds}\n" + ENV)
    store = tmp / f"{name}.h5"
    run_campaign(load_campaign(spec), store, workers=1, progress=False)
    return store


@pytest.fixture(scope="module")
def stores(tmp_path_factory, small_basin_dir):
    tmp = tmp_path_factory.mktemp("sft")
    bad = tmp / "bad.json"
    bad.write_text(json.dumps(["Dry everything out. <tool_call>\n{\"name\": \"set_parameters\", \"arguments\": "
                               "{\"wm\": 10.0, \"im\": 0.0}}\n</tool_call>", {"name": "run_simulation"},
                               {"name": "evaluate"}]))
    agents = ("  - {name: heuristic, kind: heuristic}\n  - {name: slow, kind: heuristic, step0: 0.2}\n"
              f"  - {{name: bad, kind: scripted, script: {bad}}}\n  - {{name: dds, kind: dds}}")
    mixed = _campaign(tmp, small_basin_dir, "mixed", agents, "[0, 1]")
    optim = _campaign(tmp, small_basin_dir, "optim", "  - {name: dds, kind: dds}", "[0]")
    return {"mixed": mixed, "optim": optim, "tmp": tmp}


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tiny_tokenizer()


def _assistant_texts(store: Path) -> dict[str, list[str]]:
    turns = read_turns(store)
    first = turns.drop_duplicates(["episode_id", "message_index"])
    return {eid: list(g.sort_values("message_index")["text"]) for eid, g in first.groupby("episode_id")}


def test_paper_preset_filters_weights_and_masks(stores, tok, tmp_path):
    eps = read_episodes(stores["mixed"]).set_index("episode_id")
    text_agents = eps[eps["agent"] != "dds"]
    good = text_agents[text_agents["best_nse"] > 0.6]
    assert set(good["agent"]) == {"heuristic", "slow"} and (eps.loc[eps["agent"] == "bad", "best_nse"] <= 0.6).all()
    out = tmp_path / "paper.h5"
    report = build_sft_data([stores["mixed"]], out, preset="paper", tokenizer=tok, tokenizer_name="tiny",
                            max_tokens=100_000, augment="none")
    assert report.kept == len(good) == 4 == report.examples
    assert report.dropped == {"nse_le_0.6": 2, "no_text": 2}
    c = report.counts
    assert c["syn_small/heuristic"]["kept"] == 2 and c["syn_small/slow"]["kept"] == 2
    assert c["syn_small/heuristic"]["examples"] == 2 and c["syn_small/slow"]["examples"] == 2
    assert c["syn_small/bad"] == {"basin": "syn_small", "agent": "bad", "kept": 0, "examples": 0, "dropped": 2,
                                  "dropped_by": {"nse_le_0.6": 2}}
    assert c["syn_small/dds"]["dropped_by"] == {"no_text": 2}

    ds = SFTDataset(out)
    assert len(ds) == 4
    order = [e for e in eps.index if e in good.index]  # original (commit) order
    assert ds.episode_ids == order
    nse = good.loc[order, "best_nse"].to_numpy()
    expected = np.array([((nse < v).sum() + ((nse == v).sum() + 1) / 2) / len(nse) for v in nse])  # mid-rank
    assert np.allclose(ds.weights, expected) and ds.weights[np.argmax(nse)] == ds.weights.max()
    assert ds.info("preset") == "paper" and ds.info("tokenizer") == "tiny" and ds.info("max_tokens") == 100_000
    assert ds.info("counts") == c and ds.info("lengths")["max"] <= 100_000
    src = ds.info("sources")
    assert src[0]["path"] == str(stores["mixed"].resolve()) and len(src[0]["sha256"]) == 64 and src[0]["episodes"] == 8
    assert ds.info("git_commit")

    texts = _assistant_texts(stores["mixed"])
    for i in range(len(ds)):
        item = ds[i]
        ids, mask = item["input_ids"], item["assistant_mask"]
        assert ids.dtype == torch.int64 and ids.shape == mask.shape and float(item["weight"]) == pytest.approx(
            expected[i])
        want = texts[item["episode_id"]]
        assert len(item["spans"]) == len(want)
        for (s, e), text in zip(item["spans"].tolist(), want):
            assert tok.decode(ids[s:e].tolist(), skip_special_tokens=False) == text + "<|im_end|>"
            assert mask[s:e].all() and (e == len(ids) or mask[e] == 0)
        assert int(mask.sum()) == sum(e - s for s, e in item["spans"].tolist())
        # the whole sequence is the rendered conversation, ending with the last assistant turn
        assert tok.decode(ids.tolist(), skip_special_tokens=False).endswith(want[-1] + "<|im_end|>")
        assert tok.decode(ids[mask == 0].tolist(), skip_special_tokens=False).count("<tool_response>") > 0
    loader = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=False)
    assert [b["episode_id"] for b in loader] == order


def test_paper_filter_drops_a_best_nse_of_exactly_0_6_and_keeps_the_next_float(stores, tok, tmp_path):
    """The paper keeps final best NSE > 0.6: an episode at exactly 0.6 is dropped, one at the next
    float above it is kept (two heuristic episodes with their stored score set to each)."""
    import dataclasses

    from hydroagent_hpc.store import EpisodeWriter, iter_episodes

    eps = [e for e in iter_episodes(stores["mixed"]) if e.agent == "heuristic"][:2]
    above = float(np.nextafter(0.6, 1.0))
    edge = tmp_path / "edge.h5"
    with EpisodeWriter(edge) as w:
        for e, nse in zip(eps, (0.6, above)):
            w.write(dataclasses.replace(e, episode_id=f"{e.episode_id}-at-{nse!r}", best_nse=nse))
    report = build_sft_data([edge], tmp_path / "edge-data.h5", preset="paper", tokenizer=tok, tokenizer_name="tiny",
                            max_tokens=100_000, augment="none")
    assert report.kept == 1 and report.dropped == {"nse_le_0.6": 1}
    assert SFTDataset(tmp_path / "edge-data.h5").episode_ids == [f"{eps[1].episode_id}-at-{above!r}"]


def test_released_preset_keeps_every_text_episode_with_clipped_weights(stores, tok, tmp_path):
    eps = read_episodes(stores["mixed"])
    text = eps[eps["agent"] != "dds"]
    out = tmp_path / "released.h5"
    report = build_sft_data([stores["mixed"]], out, preset="released", tokenizer=tok, max_tokens=100_000)
    assert report.kept == len(text) == 6 and report.dropped == {"no_text": 2}
    ds = SFTDataset(out)
    assert ds.episode_ids == list(text["episode_id"])
    want = np.clip((text["best_nse"].to_numpy() + 1) / 2, 0.1, 1.0)
    assert np.allclose(ds.weights, want) and ds.weights.min() < 0.6 < ds.weights.max()
    assert "clip((best NSE + 1) / 2, 0.1, 1)" in ds.info("weighting")


def test_stored_conversation_is_the_one_the_agent_saw(stores, tok, small_basin_dir, small_sim):
    """Rebuilt from the store, an episode's messages and ids equal the live conversation's."""
    from hydroagent_hpc.agents.factory import make_agent
    from hydroagent_hpc.campaign import AgentSpec
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.env.episode import run_episode
    from hydroagent_hpc.env.toolcalls import tool_schemas
    from hydroagent_hpc.sim.basin import load_basin
    from hydroagent_hpc.store import EpisodeWriter, load_episode

    cfg = preset("paper", max_simulations=2, max_turns=None, patience=None, target_nse=0.99)
    agent = make_agent(AgentSpec(name="heuristic", kind="heuristic", options={}), 0, cfg)
    seen: list[dict] = []

    class Recorder:
        name = "heuristic"

        def act(self, messages):
            reply = agent.act(messages)
            seen[:] = [dict(m) for m in messages] + [{"role": "assistant", "content": reply}]
            return reply

    ep = run_episode(Recorder(), CalibrationEnv(load_basin(small_basin_dir), small_sim, cfg, agent="heuristic"))
    store = stores["tmp"] / "live.h5"
    with EpisodeWriter(store) as w:
        w.write(ep)
    stored = load_episode(store, ep.episode_id)
    msgs = episode_messages(stored)
    assert msgs[:len(seen)] == seen and all(m["role"] == "tool" for m in msgs[len(seen):])
    b = TrajectoryBuilder(tok, tools=tool_schemas())
    assert b.build(msgs).input_ids == b.build(seen).input_ids


def test_over_long_sequences_are_refused_by_name_and_nothing_is_written(stores, tok, tmp_path):
    ok = tmp_path / "ok.h5"
    r = build_sft_data([stores["mixed"]], ok, preset="paper", tokenizer=tok, max_tokens=100_000)
    longest, shortest = int(r.lengths["max"]), int(r.lengths["min"])
    assert shortest < longest  # the two heuristics' episodes differ in length
    before = ok.read_bytes()
    with pytest.raises(SFTDataError) as info:
        build_sft_data([stores["mixed"]], ok, preset="paper", tokenizer=tok, max_tokens=longest - 1)
    msg = str(info.value)
    ds_ids = SFTDataset(ok).episode_ids
    over = [e for e in ds_ids if f"{e} ({longest} tokens)" in msg]
    assert over and f"exceed --max-tokens {longest - 1}" in msg and "nothing was written" in msg
    assert f"at least {longest}" in msg
    assert ok.read_bytes() == before  # the earlier file is untouched
    new = tmp_path / "new.h5"
    with pytest.raises(SFTDataError, match="exceed --max-tokens"):
        build_sft_data([stores["mixed"]], new, preset="paper", tokenizer=tok, max_tokens=shortest - 1)
    assert not new.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ok.h5"]
    # exactly at the budget is fine
    build_sft_data([stores["mixed"]], new, preset="paper", tokenizer=tok, max_tokens=longest, augment="none")
    assert len(SFTDataset(new)) == 4


def test_bad_inputs_get_one_clear_error_each(stores, tok, tmp_path, capsys):
    out = tmp_path / "d.h5"
    with pytest.raises(SFTDataError, match=r"--from .*missing.h5: no such episode store"):
        build_sft_data([stores["mixed"], tmp_path / "missing.h5"], out, tokenizer=tok)
    with pytest.raises(SFTDataError, match=r"optim.h5: no episode with assistant text \(1 episodes, agents dds\); "
                                           r"classic optimizers"):
        build_sft_data([stores["mixed"], stores["optim"]], out, tokenizer=tok)
    with pytest.raises(SFTDataError, match="--preset 'best': unknown"):
        build_sft_data([stores["mixed"]], out, preset="best", tokenizer=tok)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(SFTDataError, match="no such SFT data file"):
        SFTDataset(out)

    from hydroagent_hpc.cli import main

    rc = main(["train", "sft-data", "--from", str(stores["optim"]), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no episode with assistant text" in err[0] and "fix:" in err[0]
    assert not out.exists()


def test_cli_writes_the_data_file(stores, tmp_path, capsys):
    from hydroagent_hpc.cli import main

    out = tmp_path / "cli.h5"
    rc = main(["-q", "train", "sft-data", "--from", str(stores["mixed"]), "--out", str(out), "--preset", "released",
               "--tokenizer", "tiny", "--max-tokens", "100000"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and summary["kept"] == 6 and summary["dropped"] == {"no_text": 2}
    assert len(SFTDataset(out)) == 6 and SFTDataset(out).info("tokenizer") == "tiny"


def test_paper_weights_are_mid_rank_percentiles():
    w = paper_weights([0.7, 0.9, 0.8, 0.9])
    assert np.allclose(w, [0.25, (3 + 4) / 2 / 4, 0.5, (3 + 4) / 2 / 4])
    assert paper_weights([]).size == 0 and math.isclose(paper_weights([0.61])[0], 1.0)


def _evaluate_followed(episode) -> list[int]:
    """Positions (among the assistant messages) of the messages right after one whose evaluate call
    was answered with a score, counted here from the stored turns."""
    msgs = sorted({t.message_index for t in episode.turns})
    scored = {t.message_index for t in episode.turns if t.tool == "evaluate" and t.kind == "tool" and t.ok}
    return [pos for pos, m in enumerate(msgs) if m - 1 in scored]


def test_stopping_point_variants_are_prefixes_with_split_weights(stores, tok, tmp_path):
    from hydroagent_hpc.env.toolcalls import tool_schemas
    from hydroagent_hpc.store import load_episode

    full_out, aug_out = tmp_path / "none.h5", tmp_path / "aug.h5"
    rn = build_sft_data([stores["mixed"]], full_out, preset="paper", tokenizer=tok, max_tokens=100_000,
                        augment="none")
    ra = build_sft_data([stores["mixed"]], aug_out, preset="paper", tokenizer=tok, max_tokens=100_000)
    full, aug = SFTDataset(full_out), SFTDataset(aug_out)
    assert full.info("augment") == "none" and aug.info("augment") == "stopping_points"  # paper default
    assert len(full) == rn.kept == ra.kept == 4 and len(aug) == ra.examples > len(full)
    b = TrajectoryBuilder(tok, tools=tool_schemas())
    seen_cut = False
    for i, eid in enumerate(full.episode_ids):
        ep = load_episode(stores["mixed"], eid)
        points = _evaluate_followed(ep)
        n_assistant = len({t.message_index for t in ep.turns})
        want = len(points) + (0 if points and points[-1] == n_assistant - 1 else 1)
        rows = [j for j, e in enumerate(aug.episode_ids) if e == eid]
        assert len(rows) == want and list(aug.variants[rows]) == list(range(want))
        assert set(aug.n_variants[rows]) == {want}
        assert math.isclose(float(aug.weights[rows].sum()), float(full.weights[i]), rel_tol=1e-12)
        assert np.allclose(aug.weights[rows], full.weights[i] / want)
        whole = full[i]["input_ids"].tolist()
        msgs = episode_messages(ep)
        at = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
        cuts = [at[p] + 1 for p in points] + ([len(msgs)] if want > len(points) else [])
        for j, cut in zip(rows, cuts):
            item = aug[j]
            ids = item["input_ids"].tolist()
            assert whole[:len(ids)] == ids  # a prefix of the full trajectory
            ref = b.build(msgs[:cut])  # and exactly the truncated conversation's trajectory
            assert ids == ref.input_ids and item["assistant_mask"].tolist() == ref.assistant_mask
            assert item["spans"].tolist() == [list(s) for s in ref.spans]
        assert aug[rows[-1]]["input_ids"].tolist() == whole  # the full conversation is the last variant
        seen_cut |= want > 1
    assert seen_cut  # some episode was actually cut
    by_agent = {row["agent"]: row["examples"] for row in aug.info("counts").values()}
    assert by_agent == {a: sum(1 for e, ag in zip(aug.episode_ids, _agents(aug_out)) if ag == a) for a in by_agent}
    assert sum(by_agent.values()) == len(aug)


def _agents(path: Path) -> list[str]:
    import h5py

    with h5py.File(path, "r") as f:
        return [s.decode() if isinstance(s, bytes) else s for s in f["agent"][()]]


def test_augment_none_and_released_default_one_example_per_episode(stores, tok, tmp_path):
    out = tmp_path / "released.h5"
    r = build_sft_data([stores["mixed"]], out, preset="released", tokenizer=tok, max_tokens=100_000)
    ds = SFTDataset(out)
    assert r.augment == "none" == ds.info("augment") and r.examples == r.kept == len(ds) == 6
    assert len(set(ds.episode_ids)) == len(ds) and set(ds.variants) == {0} and set(ds.n_variants) == {1}
    with pytest.raises(SFTDataError, match="--augment 'all': unknown"):
        build_sft_data([stores["mixed"]], tmp_path / "x.h5", tokenizer=tok, augment="all")
    assert not (tmp_path / "x.h5").exists()


def test_cli_augment_option(stores, tmp_path, capsys):
    from hydroagent_hpc.cli import main

    out = tmp_path / "cli.h5"
    rc = main(["-q", "train", "sft-data", "--from", str(stores["mixed"]), "--out", str(out), "--preset", "released",
               "--augment", "stopping_points", "--max-tokens", "100000"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and summary["augment"] == "stopping_points" and summary["kept"] == 6
    ds = SFTDataset(out)
    assert summary["examples"] == len(ds) > 6 and ds.info("augment") == "stopping_points"


def test_the_cli_choices_match_the_library():
    """cli/train.py keeps torch-free copies of the preset and augment names: they must not drift."""
    from hydroagent_hpc.cli import train as cli_train
    from hydroagent_hpc.train.sft.data import AUGMENT_MODES, RENDERERS, SFT_PRESETS

    assert cli_train._SFT_PRESETS == SFT_PRESETS and cli_train._AUGMENT_MODES == AUGMENT_MODES
    assert cli_train._RENDERERS == RENDERERS


def test_the_calls_renderer_turns_optimizer_episodes_into_the_calls_they_made(stores, tok, tmp_path):
    """An optimizer store is refused without a renderer; with --render calls every assistant message
    is exactly one Hermes block that parses back to the call the environment recorded."""
    from hydroagent_hpc.env.toolcalls import parse_message
    from hydroagent_hpc.store import iter_episodes
    from hydroagent_hpc.train.sft.data import episode_messages, render_calls

    with pytest.raises(SFTDataError, match="--render calls"):
        build_sft_data([stores["optim"]], tmp_path / "none.h5", preset="released", tokenizer=tok)
    report = build_sft_data([stores["optim"]], tmp_path / "calls.h5", preset="released", tokenizer=tok,
                            render="calls")
    assert report.kept == 1 and report.render == "calls" and SFTDataset(tmp_path / "calls.h5").info("render") == "calls"
    episode = next(iter(iter_episodes(stores["optim"])))
    messages = episode_messages(render_calls(episode))
    said = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(said) == len(episode.turns) > 3
    for text, turn in zip(said, episode.turns):
        parsed = parse_message(text)
        assert not parsed.failures and len(parsed.calls) == 1 and text.endswith("</tool_call>")
        call = parsed.calls[0]
        assert call.name == turn.tool
        recorded = {k: float(v) for k, v in (turn.arguments or {}).items()}
        assert {k: float(v) for k, v in call.arguments.items()} == recorded
    # text episodes are left as they were: the mixed store's heuristic text is unchanged by the renderer
    mixed = build_sft_data([stores["mixed"]], tmp_path / "mixed.h5", preset="released", tokenizer=tok, render="calls")
    assert mixed.dropped == {} and mixed.kept == 8


# ---------------------------------------------------------------------------------------------
# Error-recovery turns (--recovery)


def _h5(path: Path) -> tuple[dict[str, bytes], dict[str, object]]:
    """Every dataset of a data file as bytes (strings: their UTF-8), and its attributes but the creation time."""
    import h5py

    def raw(a: np.ndarray) -> bytes:
        return b"\0".join(a.tolist()) if a.dtype.kind == "O" else a.tobytes()

    with h5py.File(path, "r") as f:
        data = {k: raw(np.asarray(f[k][()])) for k in f}
        attrs = {k: f.attrs[k] for k in f.attrs if k != "created_utc"}
    return data, attrs


@pytest.fixture
def live_env(small_basin_dir, small_sim):
    """A real environment configured as the stores' campaigns were (ENV), to compare replies with."""
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.sim.basin import load_basin

    cfg = preset("paper", max_simulations=3, max_turns=None, patience=None, target_nse=0.99)
    return CalibrationEnv(load_basin(small_basin_dir), small_sim, cfg, agent="recovery-test")


def _live_reply(env, text: str) -> list[dict]:
    """What the real environment answers ``text`` with, from a fresh episode."""
    env.reset()
    result = env.step(text)
    assert env.counters["simulations"] == 0 and env.params == env._initial  # nothing ran
    return result.observations


@pytest.mark.parametrize("kind,reason", [("repeated_key", "malformed_json"), ("value_for_object", "bad_arguments"),
                                         ("truncated", "malformed_json"), ("missing_brace", "malformed_json")])
def test_every_corruption_fails_the_real_parser(stores, live_env, kind, reason):
    """Each kind, on every teacher message of the store (calls with and without arguments), is one
    parse failure in the real environment, and the builder's reply is that environment's reply."""
    from hydroagent_hpc.env.toolcalls import render_tool_response
    from hydroagent_hpc.train.sft.data import RECOVERY_KINDS, corrupt_call, failure_replies

    assert kind in RECOVERY_KINDS and len(RECOVERY_KINDS) == 4
    rng = np.random.default_rng(0)
    texts = [t for ts in _assistant_texts(stores["mixed"]).values() for t in ts if t]
    assert {"set_parameters", "run_simulation", "evaluate"} <= {t.split('"name": "')[1].split('"')[0] for t in texts}
    for text in texts:
        bad = corrupt_call(text, kind, rng)
        assert bad != text and bad.split("<tool_call>")[0] == text.split("<tool_call>")[0]  # prose kept
        obs = _live_reply(live_env, bad)
        assert [(o["error"], o["reason"]) for o in obs] == [("parse_failure", reason)]
        replies, failures = failure_replies(bad, live_env.config)
        assert replies == [render_tool_response(o) for o in obs] and [f.reason for f in failures] == [reason]
        if kind == "repeated_key":
            assert "duplicate key" in obs[0]["detail"]
    with pytest.raises(ValueError, match="unknown corruption 'swap'"):
        corrupt_call(texts[0], "swap", rng)


def test_recovery_turns_mask_the_corrupted_call_and_show_the_environments_reply(stores, tok, tmp_path, live_env):
    """recovery=1: before every teacher message a mask-0 corrupted copy, then the real environment's
    reply to it, then the teacher's message with mask 1; the teacher's turns are unchanged."""
    from hydroagent_hpc.env.toolcalls import parse_message, render_tool_response
    from hydroagent_hpc.train.sft.data import RECOVERY_KINDS

    report = build_sft_data([stores["mixed"]], tmp_path / "rec.h5", preset="released", tokenizer=tok,
                            max_tokens=100_000, recovery=1.0)
    build_sft_data([stores["mixed"]], tmp_path / "plain.h5", preset="released", tokenizer=tok, max_tokens=100_000)
    ds, ref = SFTDataset(tmp_path / "rec.h5"), SFTDataset(tmp_path / "plain.h5")
    assert ds.episode_ids == ref.episode_ids and np.array_equal(ds.weights, ref.weights)
    n_bad = 0
    for i in range(len(ds)):
        item, plain = ds[i], ref[i]
        ids, mask, spans = item["input_ids"], item["assistant_mask"], item["spans"].tolist()
        texts = [tok.decode(ids[s:e].tolist(), skip_special_tokens=False) for s, e in spans]
        teacher = [tok.decode(plain["input_ids"][s:e].tolist(), skip_special_tokens=False)
                   for s, e in plain["spans"].tolist()]
        trained = [bool(mask[s:e].all()) for s, e in spans]
        assert all(t or not mask[s:e].any() for t, (s, e) in zip(trained, spans))  # all 1 or all 0 per turn
        assert [t for t, ok in zip(texts, trained) if ok] == teacher  # mask 1: exactly the teacher's turns
        assert int(mask.sum()) == int(plain["assistant_mask"].sum())
        assert trained == [False, True] * len(teacher)  # P = 1: every teacher message has its corrupted copy
        for k in range(0, len(spans), 2):
            bad, good = texts[k].removesuffix("<|im_end|>"), texts[k + 1].removesuffix("<|im_end|>")
            assert not parse_message(bad).calls and len(parse_message(good).calls) == 1
            obs = _live_reply(live_env, bad)
            between = tok.decode(ids[spans[k][1]:spans[k + 1][0]].tolist(), skip_special_tokens=False)
            assert len(obs) == 1 and obs[0]["error"] == "parse_failure"
            assert f"<tool_response>\n{render_tool_response(obs[0])}\n</tool_response>" in between
            assert between.count("<tool_response>") == 1
            n_bad += 1
    assert n_bad == report.recovery_turns == sum(report.recovery_kinds.values()) > 20
    assert set(report.recovery_kinds) == set(RECOVERY_KINDS)
    assert ds.info("recovery") == 1.0 and ds.info("recovery_kinds") == report.recovery_kinds
    assert ds.info("recovery_seed") == 0


def test_recovery_is_seeded_and_p0_writes_the_datasets_of_a_build_without_it(stores, tok, tmp_path):
    from hydroagent_hpc.store import load_episode
    from hydroagent_hpc.train.sft.data import episode_tools

    def build(name: str, **kw) -> tuple[dict[str, bytes], dict[str, object]]:
        build_sft_data([stores["mixed"]], tmp_path / name, preset="released", tokenizer=tok, max_tokens=100_000, **kw)
        return _h5(tmp_path / name)

    a, b = build("a.h5", recovery=0.5, recovery_seed=3), build("b.h5", recovery=0.5, recovery_seed=3)
    assert a == b  # same inputs, same file (but its creation time)
    c = build("c.h5", recovery=0.5, recovery_seed=4)
    assert c[0]["input_ids"] != a[0]["input_ids"] and c[1]["recovery_seed"] == 4
    kinds = json.loads(str(a[1]["recovery_kinds"]))
    assert 0 < sum(kinds.values()) < sum(len(t) for t in _assistant_texts(stores["mixed"]).values())  # p = 0.5

    off, default = build("off.h5", recovery=0.0), build("default.h5")
    assert off[0] == default[0] and off[1]["recovery"] == 0.0 and off[1]["recovery_kinds"] == "{}"
    for name, kw in (("paper0.h5", {"recovery": 0.0}), ("paper.h5", {})):  # with stopping-point variants too
        build_sft_data([stores["mixed"]], tmp_path / name, preset="paper", tokenizer=tok, max_tokens=100_000, **kw)
    assert _h5(tmp_path / "paper0.h5")[0] == _h5(tmp_path / "paper.h5")[0]
    ds = SFTDataset(tmp_path / "off.h5")
    for i, eid in enumerate(ds.episode_ids):  # the teacher's conversation alone, built without the option's code
        ep = load_episode(stores["mixed"], eid)
        traj = TrajectoryBuilder(tok, tools=episode_tools(ep)).build(episode_messages(ep))
        assert ds[i]["input_ids"].tolist() == traj.input_ids and ds[i]["assistant_mask"].tolist() == traj.assistant_mask


def test_recovery_keeps_the_stopping_point_cuts(stores, tok, tmp_path):
    """With stopping-point variants, each variant still ends with a teacher turn the model learns."""
    rp = build_sft_data([stores["mixed"]], tmp_path / "p.h5", preset="paper", tokenizer=tok, max_tokens=100_000)
    rr = build_sft_data([stores["mixed"]], tmp_path / "r.h5", preset="paper", tokenizer=tok, max_tokens=100_000,
                        recovery=1.0)
    plain, rec = SFTDataset(tmp_path / "p.h5"), SFTDataset(tmp_path / "r.h5")
    assert rp.examples == rr.examples == len(rec) > rp.kept and rr.recovery_turns > 0
    assert list(rec.variants) == list(plain.variants) and np.array_equal(rec.weights, plain.weights)
    for i in range(len(rec)):
        mask, spans = rec[i]["assistant_mask"], rec[i]["spans"].tolist()
        assert mask[spans[-1][0]:spans[-1][1]].all() and len(spans) == 2 * len(plain[i]["spans"])
        assert int(mask.sum()) == int(plain[i]["assistant_mask"].sum())


def test_a_bad_recovery_value_is_a_clear_error_naming_the_flag(stores, tok, tmp_path, capsys):
    from hydroagent_hpc.cli import main

    out = tmp_path / "d.h5"
    for bad in (-0.1, 1.5, float("nan"), True, "0.3"):
        with pytest.raises(SFTDataError, match=r"--recovery .*must be a probability in \[0, 1\]"):
            build_sft_data([stores["mixed"]], out, tokenizer=tok, recovery=bad)
    with pytest.raises(SFTDataError, match=r"--recovery-seed -1: must be a whole number >= 0"):
        build_sft_data([stores["mixed"]], out, tokenizer=tok, recovery=0.3, recovery_seed=-1)
    for bad, says in (("-0.1", "-0.1 is not a probability"), ("1.5", "1.5 is not a probability"),
                      ("x", "'x' is not a number")):
        with pytest.raises(SystemExit) as info:
            main(["train", "sft-data", "--from", str(stores["mixed"]), "--out", str(out), "--recovery", bad])
        err = capsys.readouterr().err
        assert info.value.code == 2 and f"argument --recovery: {says}" in err
    assert not out.exists()
    rc = main(["-q", "train", "sft-data", "--from", str(stores["mixed"]), "--out", str(out), "--preset", "released",
               "--max-tokens", "100000", "--recovery", "0.3", "--recovery-seed", "7"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ds = SFTDataset(out)
    assert rc == 0 and summary["recovery_turns"] > 0 and ds.info("recovery") == 0.3 and ds.info("recovery_seed") == 7
