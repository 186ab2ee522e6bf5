"""The fused optimizer update (:class:`~tf_transformer.train.step.CompiledUpdate`): Adam with global-norm clipping
and its schedule as one XLA function, against a numpy restatement and against the op-by-op update."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import built_model_and_optimizer, padded_ids
from tf_transformer.hparams import load_hparams
from tf_transformer.train.step import CompiledUpdate, make_optimizer, make_train_step

BETA_1, BETA_2, EPSILON, LEARNING_RATE, WARMUP = 0.8, 0.95, 1e-3, 0.05, 2
SHAPES = [(4, 3), (3,), (2, 5, 2), (6, 3)]  # the last one gets sparse gradients (an embedding's rows)
STEPS = 4


def adam_hp(clip_norm, *overrides):
    return load_hparams("toy", overrides=[f"adam_beta1={BETA_1}", f"adam_beta2={BETA_2}", f"adam_epsilon={EPSILON}",
                                          f"learning_rate={LEARNING_RATE}", "lr_schedule=noam",
                                          f"warmup_steps={WARMUP}", f"clip_norm={clip_norm}", *overrides])


def gradient_steps(seed=0, scale=1.0):
    """STEPS lists of gradients, one per variable of SHAPES: dense ones, then an IndexedSlices of rows 4, 0, 2."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(STEPS):
        dense = [scale * rng.normal(size=shape).astype(np.float32) for shape in SHAPES[:-1]]
        rows = scale * rng.normal(size=(3, SHAPES[-1][1])).astype(np.float32)
        steps.append(dense + [(np.array([4, 0, 2]), rows)])
    return steps


def as_tensors(gradients, dense=False):
    """The gradients as tensors, the last one an ``IndexedSlices`` (``dense``: summed into a dense tensor, as
    the train step gives every update path its gradients)."""
    *dense_ones, (indices, rows) = gradients
    sparse = tf.IndexedSlices(tf.constant(rows), tf.constant(indices), tf.constant(SHAPES[-1], tf.int64))
    return [tf.constant(g) for g in dense_ones] + [tf.convert_to_tensor(sparse) if dense else sparse]


def numpy_adam(start, steps, clip_norm):
    """Adam restated: gradients clipped to global norm ``clip_norm`` (0: not), the Noam rate at step t,
    bias correction folded into it, lr_t = lr(t) sqrt(1 - beta2^t) / (1 - beta1^t), w -= lr_t m / (sqrt(v) + eps).
    Returns (weights, m, v, clipped: whether any step was clipped)."""
    weights = [w.astype(np.float64) for w in start]
    m, v = [np.zeros_like(w) for w in weights], [np.zeros_like(w) for w in weights]
    clipped = False
    for t, gradients in enumerate(steps, 1):
        *dense, (indices, rows) = gradients
        sparse = np.zeros(SHAPES[-1])
        np.add.at(sparse, indices, rows)
        grads = [g.astype(np.float64) for g in dense] + [sparse]
        norm = np.sqrt(sum((g ** 2).sum() for g in grads))
        if clip_norm and norm > clip_norm:
            grads, clipped = [g * clip_norm / norm for g in grads], True
        lr = LEARNING_RATE * WARMUP ** 0.5 * min(t * WARMUP ** -1.5, t ** -0.5)
        lr_t = lr * np.sqrt(1 - BETA_2 ** t) / (1 - BETA_1 ** t)
        for i, g in enumerate(grads):
            m[i] = BETA_1 * m[i] + (1 - BETA_1) * g
            v[i] = BETA_2 * v[i] + (1 - BETA_2) * g * g
            weights[i] = weights[i] - lr_t * m[i] / (np.sqrt(v[i]) + EPSILON)
    return weights, m, v, clipped


def updater(optimizer, variables, fused):
    """``update(gradients)`` of ``variables``: compiled (:class:`CompiledUpdate`) or op by op (``apply``)."""
    if fused:
        return CompiledUpdate(optimizer, lambda: variables)
    return lambda gradients: optimizer.apply(gradients, variables)


def run_updates(optimizer, start, steps, fused, dense=False):
    """The variables and the optimizer's slots ({path: value}) after one update per element of ``steps``
    (``dense``: the sparse gradient summed dense first, :func:`as_tensors`)."""
    variables = [keras.Variable(w, name=f"w{i}") for i, w in enumerate(start)]
    update = updater(optimizer, variables, fused)
    for t, gradients in enumerate(steps, 1):
        update(as_tensors(gradients, dense))
        assert int(optimizer.iterations.numpy()) == t  # one step of the count and the schedule per update
    return [w.numpy() for w in variables], {v.path: v.numpy() for v in optimizer.variables}


def start_weights():
    rng = np.random.default_rng(1)
    return [rng.normal(size=shape).astype(np.float32) for shape in SHAPES]


@pytest.mark.parametrize("clip_norm,scale,clips", [(1.0, 1.0, True), (100.0, 1.0, False), (0, 3.0, False)])
def test_fused_update_is_adam_with_global_norm_clipping_and_the_schedule(clip_norm, scale, clips):
    start, steps = start_weights(), gradient_steps(scale=scale)
    optimizer = make_optimizer(adam_hp(clip_norm))
    weights, slots = run_updates(optimizer, start, steps, fused=True)
    want_weights, want_m, want_v, clipped = numpy_adam(start, steps, clip_norm)
    assert clipped == clips
    for i, (got, want) in enumerate(zip(weights, want_weights)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.abs(got - start[i]).max() > 0.01  # the updates did move every variable
        np.testing.assert_allclose(slots[f"adam/w{i}_momentum"], want_m[i], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(slots[f"adam/w{i}_velocity"], want_v[i], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("clip_norm", [1.0, 0])
def test_fused_update_equals_the_op_by_op_update(clip_norm):
    start, steps = start_weights(), gradient_steps(seed=2)
    for gradients in steps:  # an embedding's gradient repeats rows
        gradients[-1] = (np.array([4, 0, 4, 2]), np.concatenate([gradients[-1][1], gradients[-1][1][:1]]))
    fused = run_updates(make_optimizer(adam_hp(clip_norm)), start, steps, fused=True)
    # the compiled update sums a sparse gradient dense itself; the op-by-op one is given it so, as the step does
    op_by_op = run_updates(make_optimizer(adam_hp(clip_norm)), start, steps, fused=False, dense=True)
    # XLA sums the global norm in its own order: float32 rounding apart
    for got, want in zip(fused[0], op_by_op[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert fused[1].keys() == op_by_op[1].keys()  # the same slots, by the same names: checkpoints unchanged
    for path, want in op_by_op[1].items():
        np.testing.assert_allclose(fused[1][path], want, rtol=1e-5, atol=1e-8, err_msg=path)


def test_fused_loss_scale_update_skips_overflowed_steps_as_the_op_by_op_one():
    """mixed_float16's LossScaleOptimizer: a step with an infinite gradient changes no weight and halves the scale."""
    start, steps = start_weights(), gradient_steps(seed=3)
    steps[1][0] = np.full(SHAPES[0], np.inf, np.float32)
    results = []
    for fused in (True, False):
        optimizer = make_optimizer(adam_hp(1.0), policy_name="mixed_float16")
        variables = [keras.Variable(w) for w in start]
        update = updater(optimizer, variables, fused)
        update(as_tensors(steps[0]))
        before = [w.numpy() for w in variables]
        scale = float(optimizer.dynamic_scale.numpy())
        update(as_tensors(steps[1]))
        assert all(np.array_equal(w.numpy(), b) for w, b in zip(variables, before))
        assert float(optimizer.dynamic_scale.numpy()) == scale / 2
        for gradients in steps[2:]:
            update(as_tensors(gradients))
        results.append([v.numpy() for v in variables] + [v.numpy() for v in optimizer.variables])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


VOCAB = 23
# A large epsilon keeps Adam from blowing rounding noise up to full steps: the key projection's bias has a zero
# gradient but for rounding (softmax ignores a shift of all scores), which m / (sqrt(v) + 1e-9) would make +-lr.
TINY = ["num_blocks=1", "num_units=16", "num_heads=2", "d_ff=32", "label_smoothing=0.1", "learning_rate=0.05",
        "adam_epsilon=1.0", "clip_norm=0.5"]


def toy_batches():
    shapes = [([3, 5, 2], [4, 1, 6]), ([7, 7], [2, 3]), ([1, 2, 4, 4, 3], [5, 5, 5, 1, 2]), ([4], [6])]
    return [(tf.constant(padded_ids(s, lx, max(lx), VOCAB)), tf.constant(padded_ids(s + 9, ly, max(ly), VOCAB)))
            for s, (lx, ly) in enumerate(shapes)]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_train_step_with_the_fused_update_equals_the_op_by_op_step(accumulate):
    hp = load_hparams("toy", overrides=TINY + [f"accumulate_steps={accumulate}"])
    batches = toy_batches()
    groups = [batches[i:i + accumulate] for i in range(0, len(batches), accumulate)]
    results = []
    for fused in (True, False):
        model, optimizer = built_model_and_optimizer(hp, VOCAB)
        step = make_train_step(model, optimizer, hp, fused_update=fused)
        assert step.fused_update == fused
        losses = [float(step(*[ids for pair in group for ids in pair])[0]) for group in groups]
        assert step.traces == 1 and int(optimizer.iterations.numpy()) == len(groups)
        results.append((losses, [v.numpy() for v in model.trainable_variables + optimizer.variables]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    for got, want in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_the_fused_update_is_asked_for_and_the_default_strategy_s_only():
    hp = load_hparams("toy", overrides=TINY)
    model, optimizer = built_model_and_optimizer(hp, VOCAB)
    assert not make_train_step(model, optimizer, hp).fused_update  # one Adam kernel a variable: faster
    assert make_train_step(model, optimizer, hp, fused_update=True).fused_update
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert not make_train_step(model, optimizer, hp, mirrored).fused_update
    with pytest.raises(ValueError, match="default strategy"):
        make_train_step(model, optimizer, hp, mirrored, fused_update=True)


def test_sparse_gradients_of_every_size_share_one_compiled_update():
    """An embedding's gradient has a row per token of the batch: passed sparse, XLA would compile the update
    again for every batch size (about 1.5 s each); it is summed into a dense gradient first."""
    variables = [keras.Variable(np.zeros(shape, np.float32), name=f"w{i}") for i, shape in enumerate(SHAPES)]
    update = CompiledUpdate(make_optimizer(adam_hp(0)), lambda: variables)
    for rows in (3, 5, 2):
        gradients = as_tensors(gradient_steps()[0])[:-1]
        indices = tf.constant(np.arange(rows) % SHAPES[-1][0])
        gradients.append(tf.IndexedSlices(tf.ones([rows, SHAPES[-1][1]]), indices, tf.constant(SHAPES[-1], tf.int64)))
        update(gradients)
    assert update._update.experimental_get_tracing_count() == 1
    np.testing.assert_array_less(variables[-1].numpy()[:5], 0)  # every sparse row given was updated
