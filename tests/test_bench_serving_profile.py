"""bench/serving_profile.py: a SavedModel call's op time by op type, and the CPU a thread setting spends."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import serving_profile  # noqa: E402
from bench.xplane import OpProfile  # noqa: E402
from tests.toy_model import TOY, toy_export  # noqa: E402


def toy_corpus(path):
    """A corpus directory of the toy pairs as its train and dev splits."""
    path.mkdir()
    for split in ("train", "dev"):
        (path / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in TOY.items()))
    return str(path)


def test_a_toy_export_s_calls_are_profiled_per_beam_size(tmp_path_factory, tmp_path, capsys):
    export_dir = os.path.dirname(toy_export(tmp_path_factory))  # the folder of versions: the bench takes the largest
    data = toy_corpus(tmp_path / "corpus")
    figures = tmp_path / "figures.json"
    serving_profile.main(["--export-dir", export_dir, "--data", data, "--beam-sizes", "1,2", "--sentences", "2",
                          "--batches", "2", "--repeats", "1", "--json", str(figures)])
    out = capsys.readouterr().out
    assert "threads: intra-op default, inter-op default; 2 batch(es) of up to 2 dev sentences" in out
    results = json.loads(figures.read_text())["results"]
    assert [r["beam_size"] for r in results] == [1, 2]
    for result in results:
        types = {row["type"]: row for row in result["types"]}
        assert types["SentencepieceTokenizeOp"]["calls_per_batch"] == 1  # the signature tokenizes a batch once
        assert 0 < result["matmul_share"] < 1 and result["sentences_per_s"] > 0
        assert f"beam {result['beam_size']}: " in out
        # The profiler's cost is named beside its figures: its run against the best unprofiled one.
        assert result["profiled_over_unprofiled_wall"] > 0
        assert f"profiled ({result['profiled_over_unprofiled_wall']:.2f}x the wall time unprofiled)" in out


def test_the_figures_are_the_timed_runs_ratios(monkeypatch):
    """The figures restated from known timings: sentences/s of the best unprofiled run, the profiled run's op
    time over its own wall time, and that wall time over the best unprofiled one."""
    runs = iter([(9.0, 9.0), (0.4, 0.4), (0.2, 0.3), (0.3, 0.3)])  # a warm-up, then three timed runs
    monkeypatch.setattr(serving_profile, "run_batches", lambda signature, batches, beam_size: next(runs))
    monkeypatch.setattr(serving_profile, "profiled", lambda run, logdir: ([], 0.5))  # no events, 0.5 s
    monkeypatch.setattr(serving_profile, "op_profile", lambda events, batches: OpProfile([], 0.75, 100.0))
    batches = [np.zeros([3]), np.zeros([1])]  # 4 sentences in 2 batches
    figures = serving_profile.measure(None, batches, 4, repeats=3, logdir=None)
    assert figures["sentences_per_s"] == 20.0  # 4 sentences in the best run's 0.2 s
    assert figures["cpu_over_wall"] == 1.5  # that run's 0.3 s of CPU
    assert figures["op_time_over_wall"] == 0.4  # 100 ms a batch x 2 batches in the profiled run's 0.5 s
    assert figures["profiled_over_unprofiled_wall"] == 2.5  # 0.5 s against the best run's 0.2 s
    assert figures["matmul_share"] == 0.75 and figures["beam_size"] == 4


@pytest.mark.parametrize("argv,fault", [
    (["--export-dir", "runs/debian/export"], "--export-dir needs --data"),
    (["--export-dir", "x", "--data", "toy", "--beam-sizes", "4,0"], "--beam-sizes"),
    (["--export-dir", "x", "--data", "toy", "--batches", "0"], "--batches 0"),
    (["--export-dir", "x", "--data", "toy", "--beam-sizes", "1,99"], "--beam-sizes 1,99: at most 64"),
])
def test_bad_flags_get_one_line(argv, fault, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serving_profile.main(argv)
    assert exit_info.value.code == 2
    assert fault in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_missing_dev_split_signature_or_a_refused_beam_size_is_named(tmp_path_factory, tmp_path, capsys):
    export_dir = os.path.dirname(toy_export(tmp_path_factory))
    data = toy_corpus(tmp_path / "corpus")
    for argv, fault in ((["--data", "toy"], "--data toy: the corpus has no dev split (it has: train)"),
                        (["--data", str(tmp_path / "nope")], f"--data {tmp_path / 'nope'}: not a directory nor an "
                                                              "embedded corpus (ding-de-en, toy)"),
                        (["--data", data, "--signature", "score"],
                         "--signature score: " + os.path.join(export_dir, "1") + " has no signature of that name with "
                         "inputs and beam_size (it has: score, serving_default, translate, translate_xla)"),
                        (["--data", data, "--signature", "translate_xla", "--beam-sizes", "2"],
                         "--beam-sizes: translate_xla refused beam size 2: beam_size of translate_xla must be 1 or 4")):
        with pytest.raises(SystemExit) as exit_info:
            serving_profile.main(["--export-dir", export_dir, *argv])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(fault)
