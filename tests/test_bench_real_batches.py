"""bench/train.py on real batches: the batches are the trainer's, every contender gets the same ones, MFU counts
only real tokens, one contender's failure or timeout leaves the others' figures, bfloat16 needs the instructions."""

import dataclasses
import os
import queue
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import train_contenders, train_timing  # noqa: E402
from bench.peers import keras_hub_missing, tf_models_missing  # noqa: E402
from bench.train import bf16_skip_reason, compare, contender_groups, measure_all, skip_reasons, table  # noqa: E402
from bench.train_batches import REAL_BATCH_TOKENS, BatchSet, batch_flops, real_batch_sets, train_flops  # noqa: E402
from bench.train_contenders import Contender, Result  # noqa: E402
from bench.train_timing import Event, follow, measure_group, peak_dtypes, run_group, start_group  # noqa: E402
from tests.helpers import padded_ids, tiny_batches  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.data.vocab import EOS_ID, PAD_ID  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.train.run import prepare_examples  # noqa: E402
from tf_transformer.train.step import epoch_batches  # noqa: E402

TINY = load_hparams("small").replace(num_blocks=1, num_units=16, num_heads=2, d_ff=32, precision="float32",
                                     lr_schedule="constant")
COUNT = 6  # real batches taken


@pytest.fixture(scope="module")
def real_sets():
    """The real batch sets of the embedded corpus: the first COUNT batches at each of REAL_BATCH_TOKENS."""
    return real_batch_sets(corpus.DEFAULT_CORPUS, COUNT)


@pytest.fixture(autouse=True)
def quick_peaks(monkeypatch):
    """A fixed matmul peak instead of the real measurement (seconds of 2048 x 2048 matmuls)."""
    monkeypatch.setattr(train_timing, "matmul_peak", lambda dtype: 1.0)


def tiny_set(count=6, vocab=40):
    """A small BatchSet of ``count`` batches of 3 pairs, lengths varying, ``</S>`` last."""
    return BatchSet("real 1024", tiny_batches(count, vocab), vocab, "tests", 1024)


def assert_pads_only_at_row_ends(ids):
    real = ids != PAD_ID
    assert (real[:, 1:] <= real[:, :-1]).all()  # once a row pads, it pads to its end
    lengths = real.sum(axis=1)
    assert (ids[np.arange(len(ids)), lengths - 1] == EOS_ID).all()


def test_real_batches_are_the_trainers_own(real_sets, tmp_path):
    hp = load_hparams("small")
    tokenizers, examples, _ = prepare_examples(corpus.corpus_splits(corpus.DEFAULT_CORPUS), hp, str(tmp_path),
                                               log=lambda line: None)
    assert [s.name for s in real_sets] == [f"real {tokens}" for tokens in REAL_BATCH_TOKENS]
    for batch_set, tokens in zip(real_sets, REAL_BATCH_TOKENS):
        assert batch_set.vocab == tokenizers[1].vocab_size == hp.vocab_size
        expected = list(epoch_batches(examples, hp.replace(batch_tokens=tokens), 0).take(COUNT))
        assert len(batch_set.batches) == COUNT
        for (x, y), (x_trainer, y_trainer) in zip(batch_set.batches, expected):
            np.testing.assert_array_equal(x, x_trainer.numpy())
            np.testing.assert_array_equal(y, y_trainer.numpy())
            assert np.count_nonzero(y) == np.count_nonzero(y_trainer.numpy())
            assert x.size <= tokens and y.size <= tokens
            assert_pads_only_at_row_ends(x)
            assert_pads_only_at_row_ends(y)
        assert batch_set.padding < 0.2  # length buckets: little padding, unlike the synthetic batches' 40%


def test_batch_flops_counts_only_real_tokens():
    x, y = padded_ids(0, [5, 3, 1], 5, 50), padded_ids(1, [4, 6, 2], 6, 50)
    wider = np.pad(x, ((0, 2), (0, 7))), np.pad(y, ((0, 2), (0, 3)))  # all-pad rows and columns added
    sizes = TINY.num_units, TINY.d_ff, TINY.num_blocks, 50
    each_alone = sum(train_flops(1, s, t, t, *sizes) for s, t in [(5, 4), (3, 6), (1, 2)])
    assert batch_flops([(x, y)], TINY, 50) == batch_flops([wider], TINY, 50) == each_alone
    assert batch_flops([(x, y)] * 3, TINY, 50) == 3 * each_alone
    assert each_alone < train_flops(3, 5, 6, 12, *sizes)  # the padded shape's count is more


def test_mfu_is_against_the_peak_of_the_compute_precision_the_cpu_has():
    group = [Contender(name, "small", TINY.replace(precision=p), 2, tiny_set())
             for name in ("keras-hub", "ours") for p in ("float32", "mixed_bfloat16")]
    results = [Result.of(c) for c in group]
    for r, tokens in zip(results, (100.0, 200.0, 300.0, 300.0)):
        r.target_tokens_per_sec, r.flops_per_sec = tokens, tokens * 1e9
    compare(results, {"float32": 1000.0, "bfloat16": 2000.0}, bf16=True)
    assert [r.mfu for r in results] == [0.1, 0.1, 0.3, 0.15]
    assert (results[2].best_peer, results[2].vs_best_peer) == ("keras-hub", 3.0)
    assert results[3].vs_best_peer == 1.5
    compare(results, {"float32": 1000.0}, bf16=False)  # emulated bfloat16: the float32 units' peak
    assert results[3].mfu == 0.3
    assert peak_dtypes(group, bf16=False) == ["float32"]
    assert peak_dtypes(group, bf16=True) == ["bfloat16", "float32"]


def recording_builder(seen):
    """A BUILDERS entry whose step records the batches it is given, as numpy."""
    def build(hp, batch_set):
        def step(x, y):
            seen.append((x.numpy(), y.numpy()))
            return tf.constant(0.0)
        return step
    return build


def failing_builder(hp, batch_set):
    raise ValueError("no such layer\nsecond line")


def test_every_contender_gets_the_same_batches_in_the_same_order(monkeypatch):
    seen = {"a": [], "b": []}
    for name in seen:
        monkeypatch.setitem(train_contenders.BUILDERS, name, recording_builder(seen[name]))
    batch_set = tiny_set()
    group = [Contender(name, "small", TINY, 4, batch_set, warmup_steps=1) for name in seen]
    events = []
    measure_group(group, 2, events.append)
    order = [0, 1, 2, 3, 4, 5] + [1, 2, 3, 4]  # warm-up (1 step, then each other batch), then 2 rounds of 2 steps
    for name in seen:
        assert len(seen[name]) == len(order)
        for (x, y), i in zip(seen[name], order):
            np.testing.assert_array_equal(x, batch_set.batches[i][0])
            np.testing.assert_array_equal(y, batch_set.batches[i][1])
    results = [e for e in events if e.kind == "result"]
    assert [e.index for e in results] == [0, 1, 0, 1]
    assert results[0].result.flops_per_sec == pytest.approx(
        batch_flops(batch_set.batches[1:3], TINY, 40) / results[0].result.seconds)
    assert events[-1].kind == "done"


def test_a_contender_that_raises_is_reported_and_the_others_keep_their_figures(monkeypatch):
    monkeypatch.setitem(train_contenders.BUILDERS, "boom", failing_builder)
    batch_set = tiny_set()
    group = [Contender(name, "small", TINY, 2, batch_set, warmup_steps=1) for name in ("ours", "boom")]
    events = []
    measure_group(group, 1, events.append)
    assert [(e.kind, e.index) for e in events if e.kind in ("failed", "result")] == [("failed", 1), ("result", 0)]
    # The parent's reading of the same events.
    results, peaks = [Result.of(c) for c in group], {}
    script = iter(events)
    assert follow(lambda timeout: next(script), [0, 1], results, 60.0, peaks)
    assert results[0].target_tokens_per_sec > 0 and results[0].note is None
    assert results[1].target_tokens_per_sec is None
    assert results[1].note == "failed: ValueError: no such layer"
    assert peaks == {"float32": 1.0}


def scripted_start(scripts, runs, asked):
    """A ``start`` for :func:`run_group` playing one list of events per process it starts, then silence
    (``queue.Empty``: the contender at work runs over its budget)."""
    def start(members, rounds):
        runs.append([c.name for c in members])
        script = iter(scripts[len(runs) - 1])

        def next_event(timeout):
            asked.append(timeout)
            try:
                return next(script)
            except StopIteration:
                raise queue.Empty from None

        return next_event, lambda finished: None
    return start


def test_a_contender_over_its_budget_is_timed_out_and_the_others_keep_their_figures(capsys):
    batch_set = tiny_set()
    group = [Contender(name, "small", TINY, 2, batch_set) for name in ("a", "slow", "c")]

    def measured(index, members):
        return Event("result", index, result=dataclasses.replace(
            Result.of(members[index]), steps=2, seconds=1.0, target_tokens_per_sec=10.0 * index + 5, flops_per_sec=1e9))

    first = [Event("start", 0), Event("start", 1), Event("start", 2), Event("peaks", peaks={"float32": 3.0}),
             Event("start", 0), measured(0, group), Event("start", 1)]  # then nothing: "slow" runs over
    second = [Event("start", 0), Event("peaks", peaks={"float32": 2.0}), Event("start", 0),
              measured(0, group[2:]), Event("done")]
    runs, asked, peaks = [], [], {}
    results = run_group(group, 1, 30.0, peaks, start=scripted_start([first, second], runs, asked))
    assert runs == [["a", "slow", "c"], ["c"]]  # the measured "a" is not run again
    assert [r.target_tokens_per_sec for r in results] == [5.0, None, 5.0]
    assert results[1].note.startswith("timed out: over its 30s")
    assert results[0].note is None and results[2].note is None
    assert peaks == {"float32": 3.0}
    assert all(0 <= t <= 30.0 for t in asked)
    assert "slow small float32 XLA off real 1024" in capsys.readouterr().out


def test_a_process_that_dies_takes_only_the_contender_at_work():
    group = [Contender(name, "small", TINY, 2, tiny_set()) for name in ("a", "b")]
    results = [Result.of(c) for c in group]
    script = iter([Event("start", 0), Event("start", 1), Event("died", error="failed: its process ended (exit "
                                                                             "status -9)")])
    assert not follow(lambda timeout: next(script), [0, 1], results, 30.0, {})
    assert results[0].note is None and results[1].note.endswith("(exit status -9)")


@pytest.mark.parametrize("flags,mode,skipped", [(["avx2", "avx512f"], "auto", True), (["avx2"], "force", False),
                                                (["avx512f", "avx512_bf16"], "auto", False),
                                                (["amx_bf16"], "auto", False), (["amx_bf16"], "off", True)])
def test_bf16_contenders_need_the_instructions_unless_forced(flags, mode, skipped):
    reason = bf16_skip_reason(mode, flags)
    assert (reason is not None) == skipped
    if skipped and mode == "auto":
        assert "avx512_bf16" in reason and "--bf16 force" in reason


def test_skipped_contenders_are_reported_and_not_run(real_sets):
    reason = bf16_skip_reason("auto", ["avx2"])
    groups = contender_groups(6, True, real_sets[:1], synthetic=False)
    ran = []

    def run(group, rounds, budget, peaks):
        ran.extend(group)
        return [Result.of(c) for c in group]

    missing = {"tf-models": "ImportError", "torch-compile": "ImportError"}
    results = measure_all(groups, skip_reasons(missing, reason), 2, 10.0, {}, run=run)
    assert sorted(c.label for c in ran) == ["keras-hub small float32 XLA off real 1024",
                                            "matmuls small float32 XLA off real 1024",
                                            "ours small float32 XLA off real 1024",
                                            "torch small float32 XLA off real 1024"]
    assert len(results) == 12
    notes = {r.label: r.note for r in results}
    assert notes["ours small mixed_bfloat16 XLA off real 1024"] == reason
    assert notes["tf-models small float32 XLA off real 1024"] == "skipped: tf-models does not import"
    assert notes["torch-compile small float32 XLA off real 1024"] == "skipped: torch-compile does not import"


def test_ours_is_compared_with_the_faster_torch_form():
    group = [Contender(name, "small", TINY, 2, tiny_set()) for name in ("ours", "torch", "torch-compile")]
    results = [Result.of(c) for c in group]
    for r, tokens in zip(results, (300.0, 100.0, 200.0)):
        r.target_tokens_per_sec, r.flops_per_sec = tokens, tokens * 1e9
    results[2].warmup_seconds = 42.0
    compare(results, {"float32": 1000.0}, bf16=False)
    assert (results[0].best_torch, results[0].vs_torch) == ("torch-compile", 1.5)
    assert results[0].best_peer is None and results[1].vs_torch is None
    lines = table(results).splitlines()
    assert "x torch" in lines[0] and "1.50x (torch-compile)" in lines[2]
    assert "build, compile and warm-up 42s" in lines[4]


@pytest.mark.parametrize("peer,missing", [("keras-hub", keras_hub_missing), ("tf-models", tf_models_missing)])
def test_the_peers_train_on_real_batches(real_sets, peer, missing):
    if missing():
        pytest.skip(f"{peer} is not installed")
    (x, y), (x2, y2) = real_sets[0].batches[:2]
    wide = np.pad(x2, ((0, 0), (0, 40 - x2.shape[1]))), y2  # more positions than the synthetic batches' 24
    batch_set = BatchSet("real 1024", [(x, y), wide], real_sets[0].vocab, "tests", 1024)
    events = []
    measure_group([Contender(peer, "small", TINY, 2, batch_set, warmup_steps=1)], 1, events.append)
    assert [e.kind for e in events if e.kind in ("failed", "result")] == ["result"]


def test_the_matmul_bound_takes_its_turns_on_batches_of_any_shape(real_sets):
    (x, y), (x2, y2) = real_sets[0].batches[:2]
    batch_set = BatchSet("real 1024", [(x, y), (x2[:, :-1], y2)], real_sets[0].vocab, "tests", 1024)
    events = []
    measure_group([Contender("matmuls", "small", TINY, 2, batch_set, warmup_steps=1)], 1, events.append)
    (bound,) = [e.result for e in events if e.kind == "result"]
    assert bound.steps == 2 and bound.flops_per_sec == pytest.approx(
        batch_flops(batch_set.batches, TINY, batch_set.vocab) / bound.seconds)  # the real work, as for ours
    peer = dataclasses.replace(bound, contender="keras-hub", target_tokens_per_sec=7.0)
    compare([peer, bound], {"float32": 1.0}, bf16=False)
    assert bound.best_peer == "keras-hub"
    assert bound.vs_best_peer == pytest.approx(bound.target_tokens_per_sec / 7.0)


@pytest.mark.slow
def test_a_group_process_reports_its_figures():
    """The spawned process end to end (imports TensorFlow again: some seconds)."""
    results = run_group([Contender("ours", "small", TINY, 2, tiny_set(), warmup_steps=1)], 1, 300.0, {},
                        start=start_group)
    assert results[0].target_tokens_per_sec > 0 and results[0].note is None
