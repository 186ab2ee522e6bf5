"""train.py interrupted and resumed ends exactly where an uninterrupted run ends: same weights, same optimizer
state, bit for bit (op determinism on). The in-memory input pipeline is stopped by SIGTERM (it saves the step it is
at); the streamed one (test_train_resume_stream.py) is killed by SIGKILL past an epoch end and its newest checkpoint
damaged, so that it resumes from an older one. Three train.py processes a pipeline: the uninterrupted run, the
interrupted one, the resumed one."""

import os
import re
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Checkpoints every 15 steps and at epoch ends: 15, 20, 30, 40, 45, 60, 75, 80. SIGTERM after the first one
# (stops at about step 16, inside epoch 1, and saves that step); SIGKILL after the first past step 30 (40, the end
# of epoch 2, whose checkpoint is then damaged): that run resumes inside epoch 2 (step 30) and trains across two
# epoch ends.
STEPS_PER_EPOCH, EPOCHS, SAVE_EVERY = 20, 4, 15
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
WORDS = [("eins", "one"), ("zwei", "two"), ("drei", "three"), ("vier", "four"), ("fuenf", "five"),
         ("rot", "red"), ("blau", "blue"), ("gruen", "green")]

pytestmark = pytest.mark.slow


def write_corpus(directory):
    """40 training pairs (20 batches of 2) and a 2-pair dev split, as TSV."""
    os.makedirs(directory)
    pairs = [(f"{a} {b} {c}", f"{x} {y} {z}") for (a, x) in WORDS[:5] for (b, y) in WORDS[5:] for (c, z) in
             WORDS[3:6]][:2 * STEPS_PER_EPOCH]
    with open(os.path.join(directory, "train.tsv"), "w") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs)
    with open(os.path.join(directory, "dev.tsv"), "w") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs[:2])
    return directory


@pytest.fixture(scope="module")
def pipeline():
    """The in-memory input pipeline (test_train_resume_stream.py: the streamed one, 5 shards of 8 pairs)."""
    return "memory"


@pytest.fixture(scope="module")
def interruption():
    """How the run is interrupted: "sigterm" (test_train_resume_stream.py: "sigkill", then a damaged checkpoint)."""
    return "sigterm"


def command(data, model_dir, pipeline):
    settings = [f"input_pipeline={pipeline}", "shard_pairs=8", "batch_size=2", "dropout_rate=0.1",
                "residual_dropout_rate=0.1", f"num_epochs={EPOCHS}",
                f"save_every_steps={SAVE_EVERY}", "eval_every_epochs=0", "beam_size=1", "keep_checkpoints=2"]
    return ([sys.executable, os.path.join(ROOT, "train.py"), "--preset", "toy", "--data", data,
             "--model-dir", model_dir, "--deterministic", "--no-export", "--no-progress", "--samples", "0"]
            + [arg for setting in settings for arg in ("--set", setting)])


def env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_to_end(data, model_dir, pipeline):
    result = subprocess.run(command(data, model_dir, pipeline), capture_output=True, text=True, env=env(), timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def checkpoint_steps(model_dir):
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None:
        return []
    return [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths]


def start_and_signal(data, model_dir, pipeline, signum, after_step):
    """Starts training and sends ``signum`` once a checkpoint past ``after_step`` is listed: the finished
    :class:`subprocess.CompletedProcess`, as :func:`run_to_end`'s."""
    process = subprocess.Popen(command(data, model_dir, pipeline), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env())
    deadline = time.monotonic() + 240
    while not any(step > after_step for step in checkpoint_steps(model_dir)):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def weights(prefix):
    """Every saved value of the model and the optimizer, by name."""
    return {name: tf.train.load_variable(prefix, name) for name, _ in tf.train.list_variables(prefix)
            if name.startswith(("model/", "optimizer/", "dropout_seeds/"))}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("resume") / "corpus"))


@pytest.fixture(scope="module")
def uninterrupted(corpus_dir, pipeline, tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("uninterrupted"))
    run_to_end(corpus_dir, model_dir, pipeline)
    return weights(os.path.join(model_dir, f"ckpt-{TOTAL_STEPS}"))


class Interrupted(NamedTuple):
    """The interrupted runs of one model directory: the stopped run, the resumed one, the step of the newest
    checkpoint when stopped and the damaged checkpoint's prefix (None after SIGTERM)."""
    model_dir: str
    stopped: subprocess.CompletedProcess
    final: subprocess.CompletedProcess
    stopped_step: int
    damaged: str | None


@pytest.fixture(scope="module")
def interrupted(corpus_dir, pipeline, interruption, tmp_path_factory):
    """SIGTERM after the first checkpoint, or SIGKILL after the first past step 30 and the newest checkpoint
    damaged; then a resumed run to the end: :class:`Interrupted`."""
    model_dir = str(tmp_path_factory.mktemp("interrupted"))
    signum, after_step = (signal.SIGTERM, 0) if interruption == "sigterm" else (signal.SIGKILL, 2 * SAVE_EVERY)
    stopped = start_and_signal(corpus_dir, model_dir, pipeline, signum, after_step)
    stopped_step, damaged = max(checkpoint_steps(model_dir)), None
    if interruption == "sigkill":
        damaged = os.path.join(model_dir, f"ckpt-{stopped_step}")
        with open(damaged + ".data-00000-of-00001", "r+b") as f:
            f.truncate(100)
    return Interrupted(model_dir, stopped, run_to_end(corpus_dir, model_dir, pipeline), stopped_step, damaged)


def test_sigterm_saves_the_current_step_and_exits_143(interrupted):
    stopped, term_step = interrupted.stopped, interrupted.stopped_step
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    saved = re.search(r"interrupted: stopped by SIGTERM; saved (\S+),", stopped.stderr)
    assert saved, stopped.stderr
    assert saved.group(1) == os.path.join(interrupted.model_dir, f"ckpt-{term_step}")
    assert 0 < term_step < TOTAL_STEPS


def test_an_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(interrupted, uninterrupted, pipeline,
                                                                          interruption):
    model_dir, stopped, stopped_step, damaged = (interrupted.model_dir, interrupted.stopped,
                                                 interrupted.stopped_step, interrupted.damaged)
    final = interrupted.final.stdout
    if pipeline == "stream":  # prepared once, by the first run; the resumed one streams the same shards
        assert "tokenized into 5 shard(s)" in stopped.stdout
        assert "tokenized into" not in final
        assert "streamed from 5 shard(s)" in final
    resumed_at = int(re.search(r"resumed from \S+ \(step (\d+),", final).group(1))
    if interruption == "sigkill":
        assert stopped.returncode == -signal.SIGKILL
        assert f"checkpoint {damaged} is unreadable" in final
        assert damaged not in final.split("resumed from")[1].splitlines()[0]
        assert resumed_at < stopped_step and resumed_at < TOTAL_STEPS - STEPS_PER_EPOCH  # epoch ends after it
    else:
        assert resumed_at == stopped_step
    resumed = weights(os.path.join(model_dir, f"ckpt-{TOTAL_STEPS}"))
    assert resumed.keys() == uninterrupted.keys()
    assert any(name.startswith("dropout_seeds/") for name in resumed)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
