"""Two worker processes on localhost streaming their own shards of the corpus (tf_transformer/data/shards.py):
every pair read once an epoch, the 20 steps trained together. A file of its own, so that the test processes run it
beside test_distribute.py, whose two workers also stop together on a signal and resume (with the in-memory pipeline;
a streamed run's resume is test_train_resume_stream.py's, in one process)."""

import re

import pytest
import tensorflow as tf

from test_distribute import STEPS, free_ports, start_workers, step_losses, wait

pytestmark = pytest.mark.slow


def test_two_workers_stream_their_own_shards_and_train_together(tmp_path):
    """The streamed pipeline on two workers: the chief prepares 3 one-pair shards, worker 0 reads shards 0 and 2,
    worker 1 shard 1 (no pair read twice in an epoch, none left out), each with half the batch, and both train to
    the end of the 20 steps (2 per epoch: worker 1's second batch is empty)."""
    model_dir = str(tmp_path / "streamed")
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    workers = start_workers(model_dir, cluster, ["input_pipeline=stream", "shard_pairs=1"])
    outputs = wait(workers)
    read = []
    for worker, (stdout, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr
        own = re.search(r"worker (\d)/2 reads shard\(s\) ([\d,]+) \((\d+) pairs\)", stdout)
        read.append((int(own.group(1)), own.group(2).split(","), int(own.group(3))))
    assert "tokenized into 3 shard(s)" in outputs[0][0] and "tokenized into" not in outputs[1][0]
    assert read == [(1, ["0", "2"], 2), (2, ["1"], 1)]  # disjoint, and together the whole corpus
    losses = step_losses(model_dir)
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{STEPS}")
