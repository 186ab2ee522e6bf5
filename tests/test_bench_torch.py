"""bench/train_torch.py: the PyTorch contender trains on the benchmark's batches (its loss finite and falling) and
has as many parameters as ours at the same configuration. Skipped when torch is not installed (CI)."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.train_batches import BatchSet  # noqa: E402
from bench.train_contenders import Contender  # noqa: E402
from bench.train_timing import measure_group  # noqa: E402
from bench.train_torch import torch_missing, torch_step, torch_transformer  # noqa: E402
from tests.helpers import tiny_batches  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.nn.model import Transformer  # noqa: E402

pytestmark = pytest.mark.skipif(torch_missing() is not None, reason="torch is not installed")

TINY = load_hparams("small").replace(num_blocks=2, num_units=16, num_heads=2, d_ff=32, precision="float32",
                                     lr_schedule="constant")
VOCAB = 40


def tiny_set(count=3):
    return BatchSet("real 1024", tiny_batches(count, VOCAB), VOCAB, "tests", 1024)


def expected_parameters(hp, vocab):
    """Counted by hand: per attention Q, K, V, W^O with biases and a layer norm; per feed-forward two layers and a
    layer norm; an encoder block has one attention, a decoder block two; two embeddings and the output layer."""
    c, f = hp.num_units, hp.d_ff
    attention = 4 * c * c + 4 * c + 2 * c
    feedforward = c * f + f + f * c + c + 2 * c
    blocks = hp.num_blocks * ((attention + feedforward) + (2 * attention + feedforward))
    embeddings = vocab * c if hp.shared_embeddings else 2 * vocab * c + c * vocab
    return blocks + embeddings + vocab


@pytest.mark.parametrize("shared", [False, True])
def test_torch_has_as_many_parameters_as_ours(shared):
    hp = TINY.replace(shared_embeddings=shared)
    ours = Transformer.from_hparams(hp, VOCAB, VOCAB)
    x, y = tiny_set().batches[0]
    ours((tf.constant(x), tf.constant(y)))
    ours_count = sum(int(np.prod(w.shape)) for w in ours.trainable_weights)
    torch_count = sum(p.numel() for p in torch_transformer(hp, VOCAB, 6).parameters())
    assert ours_count == torch_count == expected_parameters(hp, VOCAB)


def test_torch_loss_is_finite_and_falls():
    batch_set = tiny_set()
    step = torch_step(TINY.replace(dropout_rate=0.0, residual_dropout_rate=0.0), batch_set)
    x, y = batch_set.batches[0]
    losses = [float(step(tf.constant(x), tf.constant(y)).numpy()) for _ in range(4)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    assert abs(losses[0] - np.log(VOCAB)) < 1.5  # starts near uniform


def test_torch_takes_its_turns_like_the_other_contenders():
    events = []
    measure_group([Contender("torch", "small", TINY, 2, tiny_set(), warmup_steps=1)], 1, events.append)
    (result,) = [e.result for e in events if e.kind == "result"]
    assert result.steps == 2 and result.target_tokens_per_sec > 0 and result.warmup_seconds > 0


@pytest.mark.slow
def test_torch_compile_trains():
    """torch.compile's form (compiles for some tens of seconds)."""
    batch_set = tiny_set()
    step = torch_step(TINY, batch_set, compiled=True)
    losses = [float(step(*map(tf.constant, batch)).numpy()) for batch in batch_set.batches]
    assert all(np.isfinite(losses))
