"""``train_minutes``: a wall-clock budget of training steps that ends the run early, as its end would."""

import time

import tensorflow as tf

from tf_transformer.data import corpus
from tf_transformer.hparams import load_hparams
from tf_transformer.train.run import train

EPOCHS = 100_000  # one step an epoch on the toy corpus: far more than a few seconds hold


def budget_run(model_dir, minutes):
    hp = load_hparams("toy", overrides=[f"num_epochs={EPOCHS}", f"train_minutes={minutes}", "eval_every_epochs=0"])
    lines = []
    started = time.monotonic()
    result = train(hp, corpus.corpus_splits("toy"), model_dir, log=lines.append, samples=0, export=False)
    return result, lines, time.monotonic() - started


def test_the_budget_stops_training_then_the_run_ends_as_usual(tmp_path):
    model_dir = str(tmp_path)
    result, lines, seconds = budget_run(model_dir, 0.05)  # 3 seconds of steps
    assert 0 < result.step < EPOCHS
    assert seconds < 120, seconds
    assert any(line.startswith(f"train_minutes=0.05 spent: stopped at step {result.step} ") for line in lines), lines
    # The cut epoch is logged as the epoch it belongs to (one step an epoch: step k is in epoch k).
    assert any(line.startswith(f"epoch {result.step}/{EPOCHS} (to batch 1): ") for line in lines), lines
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{result.step}")
    assert result.dev is not None  # the end of the run: the dev split (here the training pairs) was scored

    # Resumed, the run gets the budget again and goes on from where it stopped.
    again, lines, _ = budget_run(model_dir, 0.05)
    assert any(line.startswith(f"resumed from {model_dir}/ckpt-{result.step} ") for line in lines), lines
    assert again.step > result.step


def test_no_budget_trains_every_epoch(tmp_path):
    hp = load_hparams("toy", overrides=["num_epochs=3", "train_minutes=0", "eval_every_epochs=0"])
    result = train(hp, corpus.corpus_splits("toy"), str(tmp_path), log=lambda line: None, samples=0,
                         export=False)
    assert result.step == 3
