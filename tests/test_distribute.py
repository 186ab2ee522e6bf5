"""tf.distribute: two logical CPU devices (mirrored) and two worker processes on localhost
(multi_worker) follow the single-device loss trajectory on the same global batches
(test_distribute_stream.py: two workers streaming their own shards).

The toy corpus in batches of 2 pairs gives global batches of 2 and 1 rows: split over two
replicas, (1, 1) and (1, 0), so one replica gets an empty slice every epoch.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import free_ports
from tf_transformer.data import corpus
from tf_transformer.hparams import load_hparams
from tf_transformer.train.run import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 10 epochs of 2 steps, a checkpoint at each epoch end. A dev evaluation at epoch 5 (the chief alone decodes and
# saves the best checkpoint while the other worker waits) and the final one at epoch 10.
SETTINGS = ["batch_size=2", "num_epochs=10", "eval_every_epochs=5", "beam_size=1", "learning_rate=0.01"]
STEPS = 20

pytestmark = pytest.mark.slow


def train_args(model_dir, strategy, extra=()):
    return (["--preset", "toy", "--data", "toy", "--model-dir", model_dir, "--strategy", strategy,
             "--no-export", "--no-progress", "--samples", "0"] + [a for s in [*SETTINGS, *extra] for a in ("--set", s)])


def step_losses(model_dir):
    """The per-step training loss the chief wrote to TensorBoard, in step order."""
    losses = {}
    for path in glob.glob(os.path.join(model_dir, "logs", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "train/loss":
                    losses[event.step] = float(tf.make_ndarray(value.tensor))
    return [losses[step] for step in sorted(losses)]


def env(**extra):
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **extra}


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("single"))
    hp = load_hparams("toy", overrides=SETTINGS)
    train(hp, corpus.corpus_splits("toy"), model_dir, log=lambda line: None, samples=0, export=False)
    losses = step_losses(model_dir)
    assert len(losses) == STEPS and losses[-1] < losses[0]
    return losses


MIRRORED = """
import sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tf_transformer.cli.train import main
sys.exit(main(sys.argv[1:]))
"""


def test_mirrored_on_two_cpu_devices_follows_the_single_device_losses(single_device, tmp_path):
    model_dir = str(tmp_path / "mirrored")
    result = subprocess.run([sys.executable, "-c", MIRRORED, *train_args(model_dir, "mirrored")],
                            capture_output=True, text=True, env=env(), cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "strategy: mirrored, 2 replica(s)" in result.stdout
    np.testing.assert_allclose(step_losses(model_dir), single_device, rtol=1e-4)


def start_workers(model_dir, cluster, extra=()):
    command = [sys.executable, os.path.join(ROOT, "train.py"), *train_args(model_dir, "multi_worker", extra)]
    configs = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(2)]
    return [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env=env(TF_CONFIG=config)) for config in configs]


def wait(workers):
    try:
        return [worker.communicate(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()


def stop_worker_1_after_a_checkpoint(model_dir, cluster):
    """Starts two workers and sends SIGTERM to worker 1 once a checkpoint is saved: both must stop
    at the same step with exit code 143. Returns their (stdout, stderr) and that step.

    The first checkpoint is that of epoch 1's end (step 2); the workers agree on stopping at epoch ends
    (after that epoch's save), so the stop lands at that end or one of the next few, long before step
    STEPS (the chief's evaluation at epoch 5 alone takes seconds)."""
    workers = start_workers(model_dir, cluster)
    deadline = time.monotonic() + 240
    while tf.train.latest_checkpoint(model_dir) is None:
        assert all(worker.poll() is None for worker in workers), wait(workers)
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    workers[1].send_signal(signal.SIGTERM)
    outputs = wait(workers)
    assert [worker.returncode for worker in workers] == [143, 143], outputs
    stopped_at = int(tf.train.latest_checkpoint(model_dir).rsplit("-", 1)[1])
    assert 0 < stopped_at < STEPS
    return outputs, stopped_at


def test_two_workers_stop_together_resume_and_follow_the_single_device_losses(single_device, tmp_path):
    """SIGTERM reaches worker 1 only: both save at the same step and exit 143; restarted, they
    resume there, and the whole loss trajectory is the single-device one. Only the chief writes."""
    model_dir = str(tmp_path / "multi")
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    outputs, stopped_at = stop_worker_1_after_a_checkpoint(model_dir, cluster)
    assert f"saved {model_dir}/ckpt-{stopped_at}," in outputs[0][1]

    workers = start_workers(model_dir, cluster)
    outputs = wait(workers)
    for worker, (stdout, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr
        assert f"resumed from {model_dir}/ckpt-{stopped_at} " in stdout
    assert "strategy: multi_worker, 2 replica(s)" in outputs[0][0]
    assert "dev at step" in outputs[0][0] and "dev at step" not in outputs[1][0]  # only the chief evaluates
    np.testing.assert_allclose(step_losses(model_dir), single_device, rtol=1e-4)
    assert len(glob.glob(os.path.join(model_dir, "logs", "events.out.tfevents.*"))) == 2  # the chief's two runs
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{STEPS}")
