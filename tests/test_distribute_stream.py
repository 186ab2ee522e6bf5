"""Two worker processes on localhost streaming their own shards of the corpus
(tf_transformer/data/shards.py): every pair read once an epoch, a stop and a resume together. A file of
its own, so that the test processes run it beside test_distribute.py."""

import re

import pytest
import tensorflow as tf

from test_distribute import STEPS, free_ports, start_workers, step_losses, stop_worker_1_after_a_checkpoint, wait

pytestmark = pytest.mark.slow


def test_two_workers_stream_their_own_shards_stop_together_and_resume(tmp_path):
    """The streamed pipeline (tf_transformer/data/shards.py) on two workers: the chief prepares 3 one-pair
    shards, worker 0 reads shards 0 and 2, worker 1 shard 1 (no pair read twice in an epoch, none left
    out), each with half the batch; SIGTERM to worker 1 stops both at the same step, and both resume
    there and train to the end of the 20 steps (2 per epoch: worker 1's second batch is empty)."""
    model_dir = str(tmp_path / "streamed")
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    extra = ["input_pipeline=stream", "shard_pairs=1"]
    outputs, stopped_at = stop_worker_1_after_a_checkpoint(model_dir, cluster, extra)
    assert "tokenized into 3 shard(s)" in outputs[0][0] and "tokenized into" not in outputs[1][0]

    workers = start_workers(model_dir, cluster, extra)
    outputs = wait(workers)
    read = []
    for worker, (stdout, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr
        assert f"resumed from {model_dir}/ckpt-{stopped_at} " in stdout
        own = re.search(r"worker (\d)/2 reads shard\(s\) ([\d,]+) \((\d+) pairs\)", stdout)
        read.append((int(own.group(1)), own.group(2).split(","), int(own.group(3))))
    assert read == [(1, ["0", "2"], 2), (2, ["1"], 1)]  # disjoint, and together the whole corpus
    losses = step_losses(model_dir)
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{STEPS}")
