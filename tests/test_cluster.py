"""``--strategy multi_worker``'s cluster (tf_transformer/cluster.py): TF_CONFIG checked before anything
starts, one line per fault; the other tasks awaited in Python, with a timeout and SIGTERM/SIGINT heard."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import free_ports
from tf_transformer.train import cluster
from tf_transformer.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO = {"worker": ["localhost:2222", "localhost:2223"]}


def config(cluster_spec=TWO, task_type="worker", index=0):
    return json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize("text, fault", [
    ("", "empty"),
    ("{bad", "not valid JSON"),
    ("[1, 2, 3]", "a JSON list, not an object"),
    ('"worker"', "a JSON str, not an object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), 'no "cluster" object'),
    (json.dumps({"cluster": TWO}), 'no "task" object'),
    (json.dumps({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}), "non-empty list"),
    (json.dumps({"cluster": {"worker": "localhost:1"}, "task": {"type": "worker", "index": 0}}), "non-empty list"),
    (config({"ps": ["localhost:1"]}, "ps"), "cluster job 'ps': multi_worker runs only chief and worker"),
    (config(task_type="chief"), "task.type 'chief': not a job of the cluster (worker)"),
    (config(index=2), "task.index 2: expected an integer from 0 to 1"),
    (config(index=-1), "task.index -1: expected an integer from 0 to 1"),
    (config(index="0"), "task.index '0': expected an integer"),
    (config(index=True), "task.index True: expected an integer"),
    (config({"worker": ["localhost"]}), "'localhost' is not an address HOST:PORT"),
    (config({"worker": ["localhost:0"]}), "'localhost:0' is not an address"),
    (config({"worker": ["localhost:70000"]}), "'localhost:70000' is not an address"),
    (config({"worker": ["local host:1"]}), "'local host:1' is not an address"),
    (config({"worker": [3]}), "3 is not an address"),
    (config({"worker": ["a:1", "a:1"]}), "a:1 listed more than once"),
    (config({"chief": ["a:1", "b:1"], "worker": ["c:1"]}), "a cluster has one chief"),
])
def test_a_malformed_tf_config_is_one_line_naming_the_fault(text, fault):
    with pytest.raises(UserError) as raised:
        cluster.read_tf_config(text)
    message = str(raised.value)
    assert message.startswith("TF_CONFIG: ") and fault in message and "\n" not in message, message


def test_a_valid_tf_config_names_this_task_and_its_peers():
    read = cluster.read_tf_config(config({"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "worker", 1))
    assert (read.task_type, read.task_index, read.address) == ("worker", 1, "w:2")
    assert read.peers == ["c:1", "w:1"]


def two_tasks():
    """A checked two-worker cluster on free local ports, as seen by worker 0."""
    ports = free_ports(2)
    return cluster.read_tf_config(config({"worker": [f"localhost:{p}" for p in ports]}))


def test_each_task_answers_on_its_own_port_until_the_other_does():
    """Two tasks in two threads: each waits for the other, and both go on once both answer. A task that
    goes on listens on its port again, as TensorFlow's server does in training: the other may not have
    seen it yet (a loaded machine)."""
    ports = free_ports(2)
    spec = {"worker": [f"localhost:{p}" for p in ports]}
    lines, errors = [], []
    both_went_on = threading.Barrier(2)

    def task(index, delay):
        time.sleep(delay)
        try:
            cluster.wait_for_peers(cluster.read_tf_config(config(spec, index=index)), 30, lines.append)
            with socket.create_server(("", ports[index])):
                both_went_on.wait(45)
        except Exception as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=task, args=(i, 1.0 * i)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert f"multi_worker: task worker:0 at localhost:{ports[0]} waits for 1 other task(s) " \
           f"(localhost:{ports[1]}; up to 30 s, --cluster-timeout)" in lines
    assert sum(line.startswith("multi_worker: all 2 tasks answer, after ") for line in lines) == 2


def test_a_missing_task_is_given_up_on_after_the_timeout_naming_it():
    read = two_tasks()
    started = time.monotonic()
    with pytest.raises(UserError, match=f"gave up after 1 s waiting for {read.peers[0]} "):
        cluster.wait_for_peers(read, 1, lambda line: None)
    assert time.monotonic() - started < 10
    with socket.create_server(("", int(read.address.rsplit(":", 1)[1]))):  # the port is free again
        pass


def test_a_taken_port_is_named():
    read = two_tasks()
    with socket.create_server(("", int(read.address.rsplit(":", 1)[1]))):
        with pytest.raises(UserError, match=f"this task's address {read.address} .*cannot listen on port"):
            cluster.wait_for_peers(read, 1, lambda line: None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_wait_at_once(signum):
    before = signal.getsignal(signum)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signum))
    timer.start()
    started = time.monotonic()
    with pytest.raises(cluster.Stopped) as stopped:
        cluster.wait_for_peers(two_tasks(), 0, lambda line: None)  # no time limit
    assert time.monotonic() - started < 10
    assert stopped.value.exit_code == 128 + signum
    assert str(stopped.value) == (f"stopped by {signum.name} while waiting for the other tasks of the cluster; "
                                  f"nothing was started")
    assert signal.getsignal(signum) == before


@pytest.mark.slow  # a train.py process
def test_train_py_waits_for_its_peer_saying_so_and_sigterm_ends_it_with_one_line(tmp_path):
    ports = free_ports(2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT,
           "TF_CONFIG": config({"worker": [f"localhost:{p}" for p in ports]})}
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--preset", "toy", "--data", "toy", "--no-progress",
               "--strategy", "multi_worker", "--model-dir", str(tmp_path / "run")]
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert worker.stdout.readline().startswith(f"multi_worker: task worker:0 at localhost:{ports[0]} waits "
                                                   f"for 1 other task(s) (localhost:{ports[1]}; up to 600 s")
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == 143 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith(("interrupted", "error"))] == [
        "interrupted: stopped by SIGTERM while waiting for the other tasks of the cluster; nothing was started"]
    assert not os.path.exists(tmp_path / "run")
