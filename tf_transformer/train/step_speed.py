"""How fast a model's training step runs on this machine, in float32 and in mixed bfloat16.

What ``precision: auto`` decides on (:mod:`tf_transformer.train.precision`): the
trainer's own step (:func:`~tf_transformer.train.step.make_train_step`, the
same optimizer, clipping and schedule) for a fresh model of the run's sizes,
on synthetic batches of the run's size, with no padding. Both steps are built
and warmed up first, then take turns, and each keeps its best turn, so a load
that comes and goes on the machine weighs on both alike.

    >>> choose_precision(load_hparams("debian"))  # doctest: +SKIP
    Choice(policy='mixed_bfloat16', reason='auto: the training step in mixed bfloat16 1.45x float32 here ...')
"""

import time

import numpy as np

from tf_transformer.nn.model import Transformer
from tf_transformer.train.precision import StepSpeed, step_shape
from tf_transformer.train.step import make_optimizer, make_train_step, precision_policy, resolve_precision

SENTENCE_LENGTH = 24  # tokens a side in the measured batches (the Debian corpus' pairs: 15-20 on average)
FIRST_ID = 4  # ids 0-3 are <PAD>, <UNK>, <S>, </S>


def synthetic_batch(hp, seed=0):
    """One (x, y) batch of ``hp``'s size: (rows, length) int32 ids each, no padding.

    ``length`` is :data:`SENTENCE_LENGTH` (at most ``hp.maxlen``); ``rows``
    fill ``hp.batch_tokens`` (or are ``hp.batch_size``).
    """
    length = min(SENTENCE_LENGTH, hp.maxlen)
    rows = max(1, hp.batch_tokens // length) if hp.batch_tokens else hp.batch_size
    ids = np.random.default_rng(seed).integers(FIRST_ID, hp.vocab_size, size=(2, rows, length), dtype=np.int32)
    return ids[0], ids[1]


def _warm_step(hp, policy, batch, warmup):
    """The trainer's step for a fresh model of ``hp`` built under ``policy``, after ``warmup`` steps on ``batch``."""
    with precision_policy(policy):
        model = Transformer.from_hparams(hp, hp.vocab_size, hp.vocab_size)
        model(batch, training=False)  # its variables, so the step makes the optimizer's slots before its trace
        step = make_train_step(model, make_optimizer(hp), hp)
        for _ in range(warmup):
            loss = step(*batch)[0]
        loss.numpy()
    return step


def _turn(step, batch, steps):
    """Seconds of ``steps`` steps of ``step`` on ``batch``."""
    started = time.perf_counter()
    for _ in range(steps):
        loss = step(*batch)[0]
    loss.numpy()
    return time.perf_counter() - started


def measure_step_speed(hp, steps=2, turns=3, warmup=2):
    """:class:`~tf_transformer.train.precision.StepSpeed` of ``hp``'s training step here: target tokens/s in
    float32 and in mixed bfloat16, each the best of ``turns`` turns of ``steps`` steps, the two taking turns."""
    batch = synthetic_batch(hp)
    policies = ("float32", "mixed_bfloat16")
    warm = {policy: _warm_step(hp, policy, batch, warmup) for policy in policies}
    best = dict.fromkeys(policies, float("inf"))
    for _ in range(turns):
        for policy in policies:
            best[policy] = min(best[policy], _turn(warm[policy], batch, steps))
    tokens = steps * batch[1].size
    return StepSpeed(tokens / best["float32"], tokens / best["mixed_bfloat16"])


def choose_precision(hp, gpus=None, cpu_flags=None, cache=None):
    """The :class:`~tf_transformer.train.precision.Choice` of ``hp.precision`` for ``hp``'s model
    (:func:`~tf_transformer.train.step.resolve_precision`; ``auto`` on a CPU with bfloat16 instructions
    measures :func:`measure_step_speed` once per machine and model, then reads the cache).

    The measured models draw their weights from Keras' global random state: seed it afterwards
    (the trainer does, in :func:`tf_transformer.train.run.build_state`)."""
    return resolve_precision(hp.precision, step_shape(hp), lambda: measure_step_speed(hp), gpus, cpu_flags, cache)
