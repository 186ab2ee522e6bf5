"""The bench suite's own logic: the FLOP count, forced decoding lengths of every contender, run.py's flags."""

import os
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import c_loader, ct2, real_text, run, serving, train  # noqa: E402
from bench.decode import best_peer, keras_hub_decoder, mask_end, tf_models_decoder  # noqa: E402
from bench.peers import keras_hub_missing, tf_models_missing  # noqa: E402
from bench.train import contender_groups, selected_groups  # noqa: E402
from bench.train_batches import train_flops  # noqa: E402
from bench.train_contenders import step_matmuls  # noqa: E402
from tests.helpers import padded_ids  # noqa: E402
from tf_transformer.data.vocab import EOS_ID  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.infer.decode import generate  # noqa: E402
from tf_transformer.nn.model import Transformer  # noqa: E402

VOCAB, SOURCE_LENGTH, TOKENS = 40, 7, 6
TINY = load_hparams("small").replace(num_blocks=1, num_units=16, num_heads=2, d_ff=32)


def matmul_shapes(B, S, T, C, F, L, V, M):
    """Every matmul of one forward pass as (rows, inner, columns), layer by layer."""
    attention = lambda q, kv: ([(B * q, C, C), (B * kv, C, C), (B * kv, C, C), (B * q, C, C)]  # noqa: E731
                               + [(B * q, C, kv), (B * q, kv, C)])  # scores, weights @ values
    ffn = lambda n: [(B * n, C, F), (B * n, F, C)]  # noqa: E731
    block_pair = attention(S, S) + ffn(S) + attention(T, T) + attention(T, S) + ffn(T)
    return block_pair * L + [(M, C, V)]


@pytest.mark.parametrize("B,S,T,C,F,L,V,M", [(1, 1, 1, 1, 1, 1, 1, 1), (3, 5, 7, 16, 48, 2, 50, 11),
                                             (64, 24, 24, 512, 2048, 6, 32000, 900)])
def test_train_flops_is_three_forward_passes_of_every_matmul(B, S, T, C, F, L, V, M):
    forward = sum(2 * m * k * n for m, k, n in matmul_shapes(B, S, T, C, F, L, V, M))
    assert train_flops(B, S, T, M, C, F, L, V) == 3 * forward


@pytest.mark.parametrize("B,S,T,C,F,L,V", [(1, 1, 1, 4, 4, 1, 1), (3, 5, 7, 16, 48, 2, 50),
                                           (64, 24, 24, 512, 2048, 6, 32000)])
def test_the_bound_runs_every_matmul_of_the_flop_count(B, S, T, C, F, L, V):
    """Without padding the packed rows are all the positions: the bound's matmuls, each with its two
    gradient matmuls, are train_flops' work exactly."""
    hp = TINY.replace(num_units=C, d_ff=F, num_blocks=L, num_heads=2 if C % 2 == 0 else 1)
    matmuls = step_matmuls(B, S, T, B * S, B * T, hp, V)
    assert 3 * sum(2 * b * m * k * n for b, m, k, n in matmuls) == train_flops(B, S, T, B * T, C, F, L, V)


def test_the_bound_packs_the_position_wise_matmuls_and_pads_attention():
    hp = TINY.replace(num_units=16, num_heads=2, d_ff=32, num_blocks=1)
    matmuls = step_matmuls(3, 5, 7, 11, 13, hp, 50)
    batched = [m for m in matmuls if m[0] > 1]
    assert batched == [(6, 5, 8, 5), (6, 5, 5, 8), (6, 7, 8, 7), (6, 7, 7, 8), (6, 7, 8, 5), (6, 7, 5, 8)]
    assert {m[1] for m in matmuls if m[0] == 1} == {11, 13}
    assert matmuls[-1] == (1, 13, 16, 50)


def source():
    """(3, SOURCE_LENGTH) int32 source ids, one row padded."""
    return tf.constant(padded_ids(0, [SOURCE_LENGTH, 4, 2], SOURCE_LENGTH, VOCAB))


@pytest.mark.parametrize("beam_size", [1, 2])
def test_ours_decodes_exactly_the_forced_length(beam_size):
    keras.utils.set_random_seed(0)
    model = Transformer.from_hparams(TINY, VOCAB, VOCAB)
    x = source()
    model((x, x))  # builds the weights
    ids = generate(mask_end(model), x, beam_size=beam_size, max_length=TOKENS)[0].numpy()
    assert ids.shape[0] == 3 and ids.shape[-1] == TOKENS
    # No hypothesis ended (a finished one is padded after its </S>). An untrained model may pick
    # <PAD> as a token now and then, so <PAD> alone proves nothing.
    assert not np.isin(ids, [EOS_ID]).any()


@pytest.mark.skipif(keras_hub_missing() is not None, reason="keras-hub is not installed")
@pytest.mark.parametrize("beam_size", [1, 2])
def test_keras_hub_decodes_exactly_the_forced_length(beam_size):
    generate = keras_hub_decoder(TINY, VOCAB, SOURCE_LENGTH, TOKENS, beam_size)
    ids = tf.function(generate)(source()).numpy()
    assert ids.shape == (3, TOKENS)
    assert ((ids >= 0) & (ids < VOCAB)).all()


@pytest.mark.skipif(tf_models_missing() is not None, reason="tf-models-official is not installed")
@pytest.mark.parametrize("beam_size", [1, 2])
def test_tf_models_decodes_exactly_the_forced_length(beam_size):
    generate = tf_models_decoder(TINY, VOCAB, TOKENS, beam_size)
    ids = tf.function(generate)(source()).numpy()
    assert ids.shape == (3, TOKENS)  # its beam search stops as soon as every hypothesis has ended
    assert ((ids >= 0) & (ids < VOCAB)).all()


def test_best_peer_is_the_fastest_peer_of_the_decoder_and_length():
    figures = {("cached greedy", 5): 100.0, ("keras-hub greedy", 5): 50.0, ("keras-hub greedy XLA", 5): 80.0,
               ("tf-models greedy", 5): 60.0, ("keras-hub beam 4", 5): 90.0, ("tf-models greedy", 9): 99.0}
    assert best_peer(figures, "greedy", 5) == ("keras-hub greedy XLA", 80.0)
    assert best_peer(figures, "beam 4", 5) == ("keras-hub beam 4", 90.0)
    assert best_peer(figures, "beam 4", 9) is None


@pytest.mark.parametrize("command,argv,fault", [
    (run, ["--parts", "train,nope"], "--parts train,nope"),
    (run, ["--parts", ","], "--parts ,"),
    (run, ["--part-timeout", "0"], "--part-timeout 0"),
    (train, ["--data", "/nope"], "--data /nope"),
    (train, ["--batches", "synthetic", "--only", "zzz"], "--only zzz"),
    (train, ["--timeout", "0"], "--timeout 0"),
    (train, ["--steps", "0"], "--steps 0"),
    # A trained model's BLEU and speed are measured on its own corpus, not the embedded default.
    (ct2, ["--model-dir", "runs/debian"], "--model-dir needs --data"),
    (c_loader, ["--model-dir", "runs/debian"], "--model-dir needs --data"),
    (c_loader, ["--export-dir", "runs/debian/export"], "--export-dir needs --data"),
    (serving, ["--model-dir", "runs/debian"], "--model-dir needs --data"),
    # A --data that is no corpus, or one without a dev split, in one line before any model is loaded.
    (ct2, ["--data", "toy"], "--data toy: the corpus has no dev split (it has: train)"),
    (c_loader, ["--data", "/nope"], "--data /nope: not a directory nor an embedded corpus"),
    (serving, ["--data", "toy"], "--data toy: the corpus has no dev split (it has: train)"),
    (real_text, ["--model-dir", ".", "--data", "toy"], "--data toy: the corpus has no dev split (it has: train)")])
def test_benches_reject_bad_flags_in_one_line(command, argv, fault, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command.main(argv)
    assert exit_info.value.code == 2
    assert fault in capsys.readouterr().err.strip().splitlines()[-1]


def test_run_table_marks_goals_and_explains_slower_figures():
    rows = [{"figure": "training small float32", "ours": "2", "peer": "1 keras-hub", "peer_name": "keras-hub",
             "ratio": 2.0, "goal": 1.5},
            {"figure": "decoding beam 4", "ours": "1", "peer": "2 keras-hub beam 4 XLA",
             "peer_name": "keras-hub beam 4 XLA", "ratio": 0.5, "goal": 2.0}]
    lines = run.table(rows).splitlines()
    assert lines[2].rstrip(" |").endswith("yes") and lines[3].rstrip(" |").endswith("NO")
    assert "XLA" in run.why_slower(rows[1])


def test_only_selects_by_label_and_drops_empty_groups():
    groups = contender_groups(6, True)
    assert {c.name for group in groups for c in group} == {"ours", "keras-hub", "tf-models"}
    assert {c.batches.vocab for group in groups for c in group if c.size == "base"} == {32000}
    chosen = selected_groups(groups, "ours base float32")
    assert [[c.label for c in group] for group in chosen] == [["ours base float32 XLA off synthetic"]]


def train_result(contender, batches, tokens_per_sec, mfu, best_peer=None, ratio=None, xla=False):
    return {"contender": contender, "size": "small", "precision": "float32", "xla": xla, "batches": batches,
            "target_tokens_per_sec": tokens_per_sec, "mfu": mfu, "best_peer": best_peer, "vs_best_peer": ratio}


def test_run_training_rows_lead_with_real_batches_and_keep_the_faster_ours():
    train = {"batch_sets": [{"name": "real 1024", "padding": 0.08}, {"name": "synthetic", "padding": 0.4}],
             "results": [train_result("keras-hub", "real 1024", 1000.0, 0.2),
                         train_result("ours", "real 1024", 900.0, 0.18, "keras-hub", 0.9),
                         train_result("keras-hub", "synthetic", 1000.0, 0.2),
                         train_result("ours", "synthetic", 1500.0, 0.3, "keras-hub", 1.5),
                         train_result("ours", "synthetic", 1800.0, 0.36, "keras-hub", 1.8, xla=True)]}
    rows = run.training_figures(train)
    assert [row["figure"] for row in rows] == [
        "training small float32, real 1024-token batches, 8% padding: target tokens/s (MFU of real work)",
        "training small float32, synthetic batches, 40% padding: target tokens/s (MFU of real work)"]
    assert [row["ours"] for row in rows] == ["900 (18%)", "1,800 (36%) XLA"]
    assert [row["peer"] for row in rows] == ["1,000 (20%) keras-hub", "1,000 (20%) keras-hub"]
    assert [row["ratio"] for row in rows] == [0.9, 1.8]


def test_run_training_rows_give_the_matmul_bound_under_ours_without_a_goal():
    train = {"batch_sets": [{"name": "real 1024", "padding": 0.08}],
             "results": [train_result("keras-hub", "real 1024", 1000.0, 0.2),
                         train_result("ours", "real 1024", 1100.0, 0.22, "keras-hub", 1.1),
                         train_result("matmuls", "real 1024", 1300.0, 0.26, "keras-hub", 1.3)]}
    rows = run.training_figures(train)
    assert [row["ours"] for row in rows] == ["1,100 (22%)", "1,300 (26%)"]
    assert rows[1]["figure"].startswith("  the bound") and rows[1]["ratio"] == 1.3
    cells = [cell.strip() for cell in run.table(rows).splitlines()[-1].split("|")[1:-1]]
    assert cells[3:] == ["1.30x", "-", "-"]  # no goal: nothing met or missed


def test_run_real_text_rows_compare_each_savedmodel_row_with_the_forced_figure():
    rows = [{"method": "forced length: 64 sentences x 24 new tokens, Python model", "sentences_per_s": 100.0,
             "vs_forced": 1.0, "bleu": None},
            {"method": "SavedModel serving_default, unsorted", "sentences_per_s": 30.0, "vs_forced": 0.3,
             "bleu": 19.75},
            {"method": "SavedModel serving_default, sorted", "sentences_per_s": 55.0, "vs_forced": 0.55,
             "bleu": 19.75},
            {"method": "Python model, sorted", "sentences_per_s": 60.0, "vs_forced": 0.6, "bleu": 19.75}]
    figures = run.real_text_figures({"rows": rows, "beam_size": 4})
    assert [f["ours"] for f in figures] == ["30.0", "55.0"]  # the SavedModel rows only
    assert [f["goal"] for f in figures] == [None, run.REAL_TEXT_GOAL]
    assert all(f["peer"] == "100.0 forced length" and "BLEU 19.8" in f["figure"] for f in figures)
    lines = run.table(figures).splitlines()
    assert lines[2].rstrip(" |").endswith("-") and lines[3].rstrip(" |").endswith("yes")


def test_real_text_batches_come_back_in_input_order_sorted_or_not():
    sentences = ["a b c d", "a", "a b", "a b c"]
    seen = []

    def signature(inputs, beam_size=None):
        texts = [t.decode() for t in inputs.numpy()]
        seen.append(texts)
        return {"translations": tf.constant([t.upper() for t in texts])}

    for order, batches in (("unsorted", [["a b c d", "a"], ["a b", "a b c"]]), ("sorted", [["a", "a b"],
                                                                                     ["a b c", "a b c d"]])):
        seen.clear()
        assert real_text.batched(signature, sentences, 2, order, beam_size=4) == [s.upper() for s in sentences]
        assert seen == batches


@pytest.mark.parametrize("block", [1, 3])
def test_latencies_take_turns_in_blocks_and_time_every_run(block):
    """bench.serving.latencies: each contender answers `block` sentences in a row, then the next (a server's
    run of requests to one model), every contender every sentence of the runs once, in the same order."""
    from bench.serving import latencies

    calls_made = []
    calls = {name: (lambda s, name=name: calls_made.append((name, s))) for name in ("a", "b")}
    figures = latencies(calls, ["s0", "s1", "s2", "s3"], runs=5, warmup=0, block=block)
    expected = {1: "a0 b0 a1 b1 a2 b2 a3 b3 a0 b0",  # runs beyond the sentences start over
                3: "a0 a1 a2 b0 b1 b2 a3 a0 b3 b0"}[block]
    assert calls_made == [(call[0], f"s{call[1]}") for call in expected.split()]
    assert set(figures) == {"a", "b"} and all(len(f) == 3 for f in figures.values())


def test_benches_translate_a_sample_of_the_whole_dev_split_not_its_first_block():
    """A built corpus keeps its sources in blocks (document order): the first N dev pairs the benches take
    come from all of them, each source beside its own reference, in the same order at every call."""
    pairs = [(f"ding {i}", f"ding ref {i}") for i in range(500)] + [(f"man {i}", f"man ref {i}") for i in range(500)]
    split = types.SimpleNamespace(read=lambda: types.SimpleNamespace(pairs=list(pairs)))
    order = serving.dev_pairs({"dev": split})
    assert sorted(order) == sorted(pairs) and order == serving.dev_pairs({"dev": split})
    assert all(source.split()[1] == reference.split()[2] for source, reference in order)
    first = [source.split()[0] for source, _ in order[:200]]
    assert 60 < first.count("ding") < 140  # about half from each block (the first 200 in file order: all Ding's)
