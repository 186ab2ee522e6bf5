"""The training step, its optimizer and learning rate, distribution helpers and per-epoch batches."""

import ast
import functools
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import built_model_and_optimizer, padded_ids
from tf_transformer.data import data_load
from tf_transformer.errors import UserError
from tf_transformer.hparams import load_hparams
from tf_transformer.nn import modules
from tf_transformer.nn.model import masked_accuracy, masked_loss, shift_right
from tf_transformer.nn.modules import NoamSchedule
from tf_transformer.train.precision import StepSpeed, step_shape
from tf_transformer.train.step import count_batches, epoch_batches, is_chief, learning_rate, make_optimizer, make_strategy, least_packed_rows, make_train_step, replica_slice, resolve_precision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VOCAB = 23
TINY = ["num_blocks=1", "num_units=16", "num_heads=2", "d_ff=32"]


def tiny_hp(*overrides):
    return load_hparams("toy", overrides=TINY + list(overrides))


def build(hp, seed=0):
    return built_model_and_optimizer(hp, VOCAB, seed)


def batch(seed, lengths_x, lengths_y):
    return (tf.constant(padded_ids(seed, lengths_x, max(lengths_x), VOCAB)),
            tf.constant(padded_ids(seed + 1, lengths_y, max(lengths_y), VOCAB)))


def test_learning_rate_follows_the_hparams():
    assert learning_rate(tiny_hp("lr_schedule=constant", "learning_rate=0.002")) == 0.002
    schedule = learning_rate(tiny_hp("lr_schedule=noam", "learning_rate=0.001", "warmup_steps=10"))
    assert isinstance(schedule, NoamSchedule)
    for iterations in (0, 4, 9, 30):
        step = iterations + 1
        expected = 0.001 * 10**0.5 * min(step * 10**-1.5, step**-0.5)
        assert float(schedule(iterations)) == pytest.approx(expected, rel=1e-6)


def test_optimizer_takes_betas_epsilon_and_clipping_from_hparams():
    optimizer = make_optimizer(tiny_hp("adam_beta1=0.8", "adam_beta2=0.95", "adam_epsilon=1e-7",
                                                "clip_norm=2.5"))
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.8, 0.95, 1e-7)
    assert optimizer.global_clipnorm == 2.5
    assert make_optimizer(tiny_hp()).global_clipnorm is None


def reference_updates(hp, batches, clip_norm):
    """The step restated: gradients of masked_loss, clipped by global norm, applied by a stock Adam."""
    model = build(hp)[0]
    optimizer = keras.optimizers.Adam(hp.learning_rate, beta_1=hp.adam_beta1, beta_2=hp.adam_beta2,
                                      epsilon=hp.adam_epsilon)
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = masked_loss(y, model((x, shift_right(y)), training=True), hp.label_smoothing)
        # an embedding's gradient summed dense (repeated ids added), as TF1's Adam and the step treat it
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
        if clip_norm:
            gradients, _ = tf.clip_by_global_norm(gradients, clip_norm)
        optimizer.apply(gradients, model.trainable_variables)
    return [v.numpy() for v in model.trainable_variables]


def apply_to(optimizer, variables, gradients):
    optimizer.apply(gradients, variables)


@pytest.mark.parametrize("traced", [False, True])
def test_fused_adam_update_equals_keras_adam_over_steps(traced):
    """ResourceApplyAdam in one kernel against Keras' element-wise Adam, five steps of the same gradients,
    eagerly and traced (as the step runs it: one ResourceApplyAdam a variable, the bias corrections' two
    powers once an update, not two a variable)."""
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (3,), (2, 5, 2), (6,)]
    values = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
    gradients = [[tf.constant(rng.normal(size=shape).astype(np.float32)) for shape in shapes] for _ in range(5)]
    hp = tiny_hp("adam_beta1=0.8", "adam_beta2=0.95", "adam_epsilon=1e-3", "learning_rate=0.05",
                 "lr_schedule=constant")
    results, updates = [], []
    for optimizer in (make_optimizer(hp),
                      keras.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3)):
        variables = [keras.Variable(v) for v in values]
        optimizer.build(variables)
        update = functools.partial(apply_to, optimizer, variables)
        update = tf.function(update) if traced else update
        for step_gradients in gradients:
            update(step_gradients)
        results.append([v.numpy() for v in variables])
        updates.append(update)
    fused, stock = results
    for got, want, start in zip(fused, stock, values):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.abs(got - start).max() > 0.05  # the updates did move the weights
    if traced:
        types = [op.type for op in updates[0].get_concrete_function(gradients[0]).graph.get_operations()]
        assert types.count("ResourceApplyAdam") == len(shapes) and types.count("Pow") == 2, types


@pytest.mark.slow
def test_step_returns_the_masked_loss_clips_then_applies_adam_and_traces_once():
    # A large epsilon makes Adam's update proportional to the gradient, so clipping shows.
    hp = tiny_hp("label_smoothing=0.1", "clip_norm=0.05", "adam_epsilon=1.0", "learning_rate=0.5")
    model, optimizer = build(hp)
    step = make_train_step(model, optimizer, hp)
    shapes = [([3, 5, 2], [4, 1, 6]), ([7, 7], [2, 3]), ([1, 2, 4, 4, 3], [5, 5, 5, 1, 2])]
    batches = [batch(seed, lengths_x, lengths_y) for seed, (lengths_x, lengths_y) in enumerate(shapes)]
    for x, y in batches:
        logits = model((x, shift_right(y)), training=False)  # dropout is 0: the same as training
        loss, accuracy = step(x, y)  # computed before the update
        np.testing.assert_allclose(loss.numpy(), masked_loss(y, logits, 0.1).numpy(), rtol=1e-5)
        np.testing.assert_allclose(accuracy.numpy(), masked_accuracy(y, logits).numpy(), rtol=1e-6)
    assert step.traces == 1  # three shapes, one trace
    assert int(optimizer.iterations.numpy()) == len(shapes)
    trained = [v.numpy() for v in model.trainable_variables]
    for got, want in zip(trained, reference_updates(hp, batches, clip_norm=0.05)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    unclipped = reference_updates(hp, batches, clip_norm=0.0)
    assert max(np.abs(a - b).max() for a, b in zip(trained, unclipped)) > 1e-3


def test_a_training_batch_packs_at_least_half_a_replicas_batch_tokens(monkeypatch):
    """The partial batches that end an epoch (each length bucket's last) have few real rows: packed to at
    least half of a replica's ``batch_tokens`` they share one row count for XLA to compile, not a new one
    each; full batches (a tenth of their positions padding) stay above it. Without ``batch_tokens``: 64."""
    hp = tiny_hp("batch_tokens=256", "label_smoothing=0.1")
    model, optimizer = build(hp)
    made = []

    class Recorded(modules.Packing):
        def __init__(self, masks, bucketed=False, least_rows=modules.LEAST_ROWS):
            super().__init__(masks, bucketed, least_rows)
            made.append((bucketed, least_rows))

    monkeypatch.setattr(modules, "Packing", Recorded)
    x, y = batch(0, [3, 5, 2], [4, 1, 6])
    logits = model((x, shift_right(y)), training=False)
    loss, _ = make_train_step(model, optimizer, hp)(x, y)
    assert made == [(True, 128), (True, 128)]  # the source's packing, then the target's
    np.testing.assert_allclose(loss.numpy(), masked_loss(y, logits, 0.1).numpy(), rtol=1e-5)
    assert [least_packed_rows(hp, replicas) for replicas in (1, 2, 4)] == [128, 64, 64]
    assert least_packed_rows(tiny_hp("batch_tokens=0")) == modules.LEAST_ROWS


def test_a_called_models_step_makes_the_optimizers_slots_before_its_trace_and_trains_the_same():
    """Keras' ``apply`` would make Adam's slots inside the step's first trace (about ten times the CPU per
    variable); the step makes them eagerly first once the model has been called, and trains as a step whose
    optimizer was built beforehand."""
    hp = tiny_hp("learning_rate=0.5")
    x, y = batch(0, [3, 2], [4, 1])
    model, built = build(hp)
    step = make_train_step(model, built, hp)
    step(x, y)
    keras.utils.set_random_seed(0)  # the helper's model again, its optimizer not built
    fresh = type(model).from_hparams(hp, VOCAB, VOCAB)
    fresh((tf.ones([1, 2], tf.int32), tf.ones([1, 2], tf.int32)))
    optimizer, inside = make_optimizer(hp), []
    build_slots = optimizer.build

    def recorded_build(variables):  # notes whether it runs inside a trace
        inside.append(tf.inside_function())
        build_slots(variables)

    object.__setattr__(optimizer, "build", recorded_build)
    make_train_step(fresh, optimizer, hp)(x, y)
    assert inside == [False]  # built once, outside the trace
    assert [v.shape for v in optimizer.variables] == [v.shape for v in built.variables]  # the same slots, in order
    for got, want in zip(fresh.trainable_variables, model.trainable_variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("rows,replicas", [(0, 2), (1, 2), (3, 2), (5, 3), (7, 4), (2, 5)])
def test_replica_slices_cover_the_batch_in_order(rows, replicas):
    x = tf.reshape(tf.range(rows * 2, dtype=tf.int32), [rows, 2])
    y = x + 100
    slices = [replica_slice(x, y, r, replicas) for r in range(replicas)]
    sizes = [int(sx.shape[0]) for sx, _ in slices]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the empty ones, if any, come last
    np.testing.assert_array_equal(tf.concat([sx for sx, _ in slices], 0), x)
    np.testing.assert_array_equal(tf.concat([sy for _, sy in slices], 0), y)


def toy_examples(count=40, seed=3):
    rng = np.random.default_rng(seed)
    sources = [rng.integers(4, VOCAB, size=rng.integers(1, 12)).tolist() + [3] for _ in range(count)]
    targets = [rng.integers(4, VOCAB, size=rng.integers(1, 12)).tolist() + [3] for _ in range(count)]
    return data_load.Examples(tf.ragged.constant(sources, tf.int32), tf.ragged.constant(targets, tf.int32))


def as_lists(dataset):
    return [(x.numpy().tolist(), y.numpy().tolist()) for x, y in dataset]


@pytest.mark.parametrize("compiled", [False, True])
def test_an_epochs_batches_are_read_without_autotuning(compiled):
    """With tf.data's autotuning, destroying an epoch's iterator waited for its tuning thread (50.7 s after an
    epoch of the debian corpus): the step loop stalled at every epoch's end and at a budget's stop."""
    hp = tiny_hp("batch_tokens=40", "maxlen=12", f"jit_compile={str(compiled).lower()}")
    dataset = epoch_batches(toy_examples(), hp, epoch=0, skip=1)
    assert dataset.options().autotune.enabled is False
    assert len(as_lists(dataset)) == count_batches(toy_examples(), hp) - 1


@pytest.mark.parametrize("batching", [["batch_tokens=0", "batch_size=3"], ["batch_tokens=40", "maxlen=12"]])
def test_epoch_order_is_fixed_by_seed_and_epoch_and_skip_resumes_it(batching):
    hp = tiny_hp(*batching)
    examples = toy_examples()
    epoch0 = as_lists(epoch_batches(examples, hp, epoch=0))
    assert as_lists(epoch_batches(examples, hp, epoch=0)) == epoch0
    assert as_lists(epoch_batches(examples, hp, epoch=1)) != epoch0
    assert as_lists(epoch_batches(examples, hp.replace(seed=hp.seed + 1), epoch=0)) != epoch0
    assert as_lists(epoch_batches(examples, hp, epoch=0, skip=4)) == epoch0[4:]
    assert count_batches(examples, hp) == len(epoch0)
    assert count_batches(examples, hp) == len(as_lists(epoch_batches(examples, hp, epoch=5)))


@pytest.mark.parametrize("batching", [["batch_tokens=0", "batch_size=3"], ["batch_tokens=40", "maxlen=12"]])
def test_xla_batches_come_in_a_finite_set_of_shapes_and_keep_their_content(batching):
    hp = tiny_hp(*batching)
    examples = toy_examples()
    plain = as_lists(epoch_batches(examples, hp, epoch=0))
    padded = list(epoch_batches(examples, hp.replace(jit_compile=True), epoch=0))
    lengths = sorted({min(b - 1, hp.maxlen) for b in data_load.bucket_boundaries(hp.maxlen)})
    for (x, y), (px, py) in zip(plain, padded):
        assert px.shape == py.shape
        rows, length = px.shape
        assert length in lengths and length >= max(len(x[0]), len(y[0]))
        assert rows == (hp.batch_tokens // length if hp.batch_tokens else hp.batch_size)
        for ids, padded_ids_ in ((x, px.numpy()), (y, py.numpy())):
            n, t = len(ids), len(ids[0])
            np.testing.assert_array_equal(padded_ids_[:n, :t], ids)
            assert not padded_ids_[n:].any() and not padded_ids_[:, t:].any()


@pytest.mark.slow
def test_xla_step_equals_the_plain_step():
    hp = tiny_hp("label_smoothing=0.1")
    x, y = batch(11, [3, 5, 2], [4, 1, 6])
    losses = {}
    for jit in (False, True):
        model, optimizer = build(hp.replace(jit_compile=jit))
        step = make_train_step(model, optimizer, hp.replace(jit_compile=jit))
        losses[jit] = [float(step(x, y)[0]) for _ in range(3)]
        assert step.traces == 1
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4)


XLA_AT_VOCAB_8000 = """
import numpy as np, keras, tensorflow as tf
from tf_transformer.hparams import load_hparams
from tf_transformer.nn.model import Transformer
from tf_transformer.train.step import count_batches, epoch_batches, is_chief, learning_rate, make_optimizer, make_strategy, make_train_step, replica_slice, resolve_precision
hp = load_hparams("small", overrides=["num_units=16", "num_heads=2", "d_ff=32", "num_blocks=1", "precision=float32",
                                       "dropout_rate=0", "residual_dropout_rate=0",
                                       "lr_schedule=constant"])
y = np.random.default_rng(0).integers(4, 8000, size=(4, 10)).astype(np.int32)
y[:, 7:] = 0
y[:, 6] = 3
losses = []
for jit in (False, True):
    keras.utils.set_random_seed(1)
    model = Transformer.from_hparams(hp, 8000, 8000)
    step = make_train_step(model, make_optimizer(hp), hp.replace(jit_compile=jit))
    losses.append([float(step(tf.constant(y), tf.constant(y))[0]) for _ in range(2)])
print(losses)
"""


def test_xla_step_compiles_at_a_real_vocabulary_size():
    """At vocabulary 8000 XLA never finished compiling the gradient of packed (data-dependent M) logits;
    the XLA step keeps every shape static instead. Run apart, so that a regression fails instead of hanging."""
    result = subprocess.run([sys.executable, "-c", XLA_AT_VOCAB_8000], capture_output=True, text=True,
                            timeout=240, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    plain, xla = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(xla, plain, rtol=1e-4)


def test_auto_precision_picks_by_device(tmp_path):
    shape = step_shape(load_hparams("debian"))

    def not_measured():
        raise AssertionError("measured where it should not be")

    def decide(precision, gpus, cpu_flags, float32=None, bfloat16=None):
        measure = (lambda: StepSpeed(float32, bfloat16)) if float32 else not_measured
        return resolve_precision(precision, shape, measure, gpus, cpu_flags, str(tmp_path / f"{float32}-{bfloat16}.json"))

    assert decide("auto", ["gpu0"], [])[0] == "mixed_float16"
    assert decide("auto", [], ["sse", "avx512_bf16"], 100, 200)[0] == "mixed_bfloat16"
    assert decide("auto", [], ["amx_bf16"], 100, 90)[0] == "float32"
    assert decide("auto", [], ["avx2"])[0] == "float32"
    assert decide("mixed_float16", [], [])[0] == "mixed_float16"
    assert "avx512_bf16" in decide("auto", [], ["avx512_bf16"], 100, 200).reason


def test_strategy_mistakes_are_user_errors(monkeypatch):
    with pytest.raises(UserError, match="nope.*default, mirrored, multi_worker"):
        make_strategy("nope")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(UserError, match="TF_CONFIG"):
        make_strategy("multi_worker")


def fake_strategy(task_type, task_id, cluster):
    spec = types.SimpleNamespace(as_dict=lambda: cluster)
    resolver = types.SimpleNamespace(task_type=task_type, task_id=task_id, cluster_spec=lambda: spec)
    return types.SimpleNamespace(cluster_resolver=resolver)


def test_the_chief_is_the_chief_task_or_else_worker_0():
    assert is_chief(tf.distribute.get_strategy())
    workers = {"worker": ["a:1", "b:2"]}
    assert is_chief(fake_strategy("worker", 0, workers))
    assert not is_chief(fake_strategy("worker", 1, workers))
    with_chief = {"chief": ["c:0"], "worker": ["a:1"]}
    assert is_chief(fake_strategy("chief", 0, with_chief))
    assert not is_chief(fake_strategy("worker", 0, with_chief))
