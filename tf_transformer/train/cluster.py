"""The cluster of ``--strategy multi_worker``: ``TF_CONFIG`` checked, and the other tasks waited for.

``TF_CONFIG`` is read before anything starts (:func:`read_tf_config`): JSON, an
object with a ``cluster`` of ``chief``/``worker`` address lists and this
process's ``task`` (its ``type`` one of the cluster's jobs, its ``index`` in
range), every address ``HOST:PORT``. A fault is one line naming it.

``tf.distribute.MultiWorkerMirroredStrategy`` waits for every task inside
TensorFlow's C++ runtime, where a missing peer hangs it with no word, no
timeout, and SIGTERM and Ctrl-C unheard. So :func:`wait_for_peers` waits first,
in Python: it answers on this task's own port (so the others see it) and tries
each other task's address until all of them answer, saying so once; SIGINT and
SIGTERM stop it at once, and it gives up after ``timeout`` seconds, naming the
tasks that never answered. The strategy is built only then.
"""

import json
import signal
import socket
import threading
import time
from typing import NamedTuple

from tf_transformer.errors import UserError

# The jobs MultiWorkerMirroredStrategy runs: one optional chief, and workers.
JOBS = ("chief", "worker")
# Seconds a worker waits for the other tasks by default (train.py --cluster-timeout).
DEFAULT_TIMEOUT = 600.0
_POLL_SECONDS = 0.25
_CONNECT_SECONDS = 1.0


class ClusterConfig(NamedTuple):
    """A checked ``TF_CONFIG``: ``cluster`` {job: [address, ...]}, this task's ``task_type`` and ``task_index``."""

    cluster: dict
    task_type: str
    task_index: int

    @property
    def address(self):
        """This task's own ``HOST:PORT``."""
        return self.cluster[self.task_type][self.task_index]

    @property
    def peers(self):
        """The other tasks' addresses, in cluster order."""
        return [address for job in JOBS for index, address in enumerate(self.cluster.get(job, []))
                if (job, index) != (self.task_type, self.task_index)]


def read_tf_config(text):
    """Parses and checks the ``TF_CONFIG`` text.

    Returns:
      :class:`ClusterConfig`.
    Raises:
      UserError: ``TF_CONFIG: ...`` naming the fault and what would be valid.
    """
    def fail(problem):
        raise UserError(f"TF_CONFIG: {problem}; expected e.g. "
                        '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}')

    if not text or not text.strip():
        fail("empty")
    try:
        config = json.loads(text)
    except ValueError as e:
        fail(f"not valid JSON ({e})")
    if not isinstance(config, dict):
        fail(f"a JSON {type(config).__name__}, not an object")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        fail("no \"cluster\" object (the jobs and their addresses)")
    if not isinstance(task, dict):
        fail("no \"task\" object (this process's type and index)")
    for job, addresses in cluster.items():
        if job not in JOBS:
            fail(f"cluster job {job!r}: multi_worker runs only {' and '.join(JOBS)} tasks")
        if not isinstance(addresses, list) or not addresses:
            fail(f"cluster.{job}: expected a non-empty list of \"HOST:PORT\" addresses, got {addresses!r}")
        for address in addresses:
            check_address(address, f"cluster.{job}", fail)
    if len(cluster.get("chief", [])) > 1:
        fail(f"cluster.chief: {len(cluster['chief'])} addresses; a cluster has one chief")
    task_type, index = task.get("type"), task.get("index")
    if task_type not in cluster:
        fail(f"task.type {task_type!r}: not a job of the cluster ({', '.join(cluster)})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task_type]):
        fail(f"task.index {index!r}: expected an integer from 0 to {len(cluster[task_type]) - 1} "
             f"(cluster.{task_type} has {len(cluster[task_type])} address(es))")
    addresses = [address for job in JOBS for address in cluster.get(job, [])]
    repeated = sorted({address for address in addresses if addresses.count(address) > 1})
    if repeated:
        fail(f"{', '.join(repeated)} listed more than once; each task needs its own address")
    return ClusterConfig(cluster, task_type, index)


def check_address(address, where, fail):
    """Calls ``fail(problem)`` unless ``address`` is ``HOST:PORT`` with a port from 1 to 65535."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or any(c.isspace() for c in address):
        fail(f"{where}: {address!r} is not an address HOST:PORT (a port from 1 to 65535)")


def _split(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _answers(address):
    """Whether something accepts a connection at ``address``."""
    try:
        with socket.create_connection(_split(address), timeout=_CONNECT_SECONDS):
            return True
    except OSError:
        return False


class Stopped(Exception):
    """SIGINT or SIGTERM ended :func:`wait_for_peers`; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} while waiting for the other tasks of the "
                         f"cluster; nothing was started")


def wait_for_peers(config, timeout, log):
    """Waits until every other task of ``config`` answers at its address, answering at this task's own
    meanwhile; see the module docstring.

    Args:
      timeout: seconds to wait at most; 0: no limit.
      log: ``callable(str)``.
    Raises:
      UserError: this task's port is taken, or the others did not all answer within ``timeout``.
      Stopped: SIGINT or SIGTERM arrived meanwhile.
    """
    if not config.peers:
        return
    with _answering(config.address), _signals_stop() as stopped:
        waiting = set(config.peers)
        started = time.monotonic()
        limit = f"up to {timeout:g} s, --cluster-timeout" if timeout else "no time limit"
        log(f"multi_worker: task {config.task_type}:{config.task_index} at {config.address} waits for "
            f"{len(waiting)} other task(s) ({', '.join(sorted(waiting))}; {limit})")
        while waiting:
            waiting = {address for address in waiting if not _answers(address)}
            if stopped:
                raise Stopped(stopped[0])
            if waiting and timeout and time.monotonic() - started > timeout:
                raise UserError(f"multi_worker: gave up after {timeout:g} s waiting for {', '.join(sorted(waiting))} "
                                f"(TF_CONFIG's cluster); start every task, or raise --cluster-timeout")
            if waiting:
                time.sleep(_POLL_SECONDS)
        log(f"multi_worker: all {len(config.peers) + 1} tasks answer, after {time.monotonic() - started:.1f} s")


class _answering:
    """Accepts (and closes) connections at ``address`` in a thread, so the other tasks see this one."""

    def __init__(self, address):
        self.address = address
        self.server = socket.socket(socket.AF_INET6 if ":" in _split(address)[0] else socket.AF_INET)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def __enter__(self):
        host, port = _split(self.address)
        try:
            self.server.bind(("", port))
        except OSError as e:
            self.server.close()
            raise UserError(f"multi_worker: this task's address {self.address} (TF_CONFIG): cannot listen on port "
                            f"{port} ({e.strerror}); is another process using it?") from None
        self.server.listen()
        self.server.settimeout(_POLL_SECONDS)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="cluster-answer", daemon=True)
        self.thread.start()
        return self

    def _serve(self):
        while not self.done.is_set():
            try:
                connection, _ = self.server.accept()
                connection.close()
            except OSError:
                continue

    def __exit__(self, *exc_info):
        self.done.set()
        self.thread.join()
        self.server.close()  # before TensorFlow's own server takes the port


class _signals_stop:
    """While active, SIGINT and SIGTERM are recorded (in the list it gives) instead of ending the process;
    the previous handlers come back on exit. Outside the main thread it records nothing."""

    def __enter__(self):
        self.received, self.previous = [], {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, lambda received, frame: self.received.append(received))
        return self.received

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
