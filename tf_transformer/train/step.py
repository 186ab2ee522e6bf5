"""The training step and what it runs under: precision, distribution, learning rate, batches.

* :func:`precision_policy` sets the Keras dtype policy that ``hp.precision``
  names (``auto`` picks one for the machine) while the model is built and
  trained, and puts the previous one back afterwards.
* :func:`make_strategy` builds the ``tf.distribute`` strategy of ``--strategy``.
* :func:`make_optimizer`: Adam with the hparams' betas, epsilon, schedule and
  ``clip_norm``; wrapped in a ``LossScaleOptimizer`` under ``mixed_float16``.
* :class:`CompiledUpdate`: the optimizer's whole update (clipping, Adam for every
  variable, schedule, ``iterations``) as one XLA-compiled function, on request
  (``fused_update=True``); by default the step runs one Adam kernel per variable.
* :func:`make_train_step`: one compiled step ``(x, y) -> (loss, accuracy)``, or with
  ``hp.accumulate_steps`` K one update from the summed gradients of K batches
  (:func:`update_groups` groups an epoch's batches).
* :func:`epoch_batches`: the batches of one epoch, in an order fixed by
  ``hp.seed`` and the epoch, from any batch on (how a resumed run continues
  exactly where the checkpoint left off).

Distributed steps: every worker's input pipeline yields the same global batches
(their order is fixed by the seed), every replica receives the whole global
batch and takes its own rows (:func:`replica_slice`; a replica may get none).
Its loss is the sum of its per-token losses divided by the number of non-pad
targets of the *global* batch, which every replica can count itself (no extra
all-reduce), so the gradients summed over replicas (one all-reduce, before
clipping and the loss-scale check) are exactly the single-device gradients of
the mean loss, however the rows fall. With streamed shards on several workers
(``local_batches``) each worker feeds only its own part of the global batch,
and one more all-reduce counts the global batch's targets.

Gradient accumulation (``accumulate_steps`` K) divides by the targets of all K
global batches (never the mean of K means, OpenNMT-py#2209's bug), counted the
same way before the first of them runs, and all-reduces the summed gradients
once per update. The K batches are the arguments of one compiled call, so a
checkpoint never falls between them: there is no accumulator to save, and a
run resumes at the batch after the last update (``Position.batch`` counts
batches, ``Position.step`` updates).
"""

import contextlib
import os

import keras
import numpy as np
import tensorflow as tf

from tf_transformer.data import data_load
from tf_transformer.data.vocab import PAD_ID
from tf_transformer.errors import UserError
from tf_transformer.nn.modules import LEAST_ROWS, NoamSchedule
from tf_transformer.options import STRATEGIES
from tf_transformer.train import cluster
from tf_transformer.train.precision import Choice, auto_cpu_precision
from tf_transformer.train.schedules import DECAYS, PlannedDecay

# Per-epoch shuffle seeds are hp.seed * _EPOCH_SEED_STRIDE + epoch.
_EPOCH_SEED_STRIDE = 1_000_003


def learning_rate(hp):
    """The hparams' schedule: a constant, :class:`~tf_transformer.nn.modules.NoamSchedule`, or
    (``linear``, ``cosine``) a :class:`~tf_transformer.train.schedules.PlannedDecay` whose plan the trainer sets."""
    if hp.lr_schedule == "noam":
        return NoamSchedule(hp.learning_rate, hp.warmup_steps)
    if hp.lr_schedule in DECAYS:
        return PlannedDecay(hp.learning_rate, hp.warmup_steps, decay=hp.lr_schedule)
    return hp.learning_rate


# ---- precision ----------------------------------------------------------------

def resolve_precision(precision, shape, measure, gpus=None, cpu_flags=None, cache=None):
    """The Keras dtype policy name for ``hp.precision``, and why (one line).

    ``auto`` gives ``mixed_float16`` when a GPU is visible; on a CPU, float32
    or ``mixed_bfloat16``, whichever trains the model faster there
    (:func:`tf_transformer.train.precision.auto_cpu_precision`: measured once
    per machine and model, only where the CPU has bfloat16 instructions).

    Args:
      precision: ``float32``, ``mixed_bfloat16``, ``mixed_float16`` or ``auto``.
      shape: the model's sizes (:func:`tf_transformer.train.precision.step_shape`).
      measure: ``() -> StepSpeed`` of the model's step
        (:func:`tf_transformer.train.step_speed.measure_step_speed`).
      gpus, cpu_flags: what to decide on; by default the visible GPUs and /proc/cpuinfo.
      cache: the cache file of ``auto_cpu_precision`` (default: its own).
    Returns:
      a :class:`~tf_transformer.train.precision.Choice`: (policy name, reason).
    """
    if precision != "auto":
        return Choice(precision, "precision set in the hyper-parameters")
    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    if gpus:
        return Choice("mixed_float16", f"auto: {len(gpus)} GPU(s) visible")
    return auto_cpu_precision(shape, measure, cpu_flags, cache)


@contextlib.contextmanager
def precision_policy(policy, mixed_precision=keras.mixed_precision):
    """Sets the global Keras dtype policy (e.g. ``mixed_bfloat16``) inside the block.

    Layers built inside keep it; the previous global policy is restored on exit,
    so code that builds models afterwards (inference, other tests) is unaffected.
    ``mixed_precision``: the module holding the global policy (``tf_keras.mixed_precision``
    for Keras 2 models).
    """
    previous = mixed_precision.global_policy()
    mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        mixed_precision.set_global_policy(previous)


# ---- distribution -------------------------------------------------------------

def make_strategy(name, cluster_timeout=cluster.DEFAULT_TIMEOUT, log=print):
    """The ``tf.distribute`` strategy of ``--strategy``.

    ``default``: one device; ``mirrored``: every local GPU (or CPU device);
    ``multi_worker``: ``MultiWorkerMirroredStrategy`` on the cluster ``TF_CONFIG``
    describes, checked first and built once every other task answers
    (:mod:`tf_transformer.train.cluster`, at most ``cluster_timeout`` seconds, 0: no limit).
    Create it before any other TensorFlow op runs.

    Raises:
      UserError: an unknown name, or ``multi_worker`` without a valid ``TF_CONFIG`` or
        without its other tasks in time.
      cluster.Stopped: SIGINT or SIGTERM while waiting for them.
    """
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")] or \
                  [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise UserError("--strategy multi_worker needs the TF_CONFIG environment variable "
                            "(the cluster and this worker's task); see tf.distribute.MultiWorkerMirroredStrategy")
        cluster.wait_for_peers(cluster.read_tf_config(os.environ["TF_CONFIG"]), cluster_timeout, log)
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise UserError(f"--strategy {name}: unknown; choose one of {', '.join(STRATEGIES)}")


def strategy_name(strategy):
    """``--strategy``'s name for ``strategy``: ``default``, ``mirrored`` or ``multi_worker``."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    return "default"


def describe_strategy(strategy):
    """``--strategy``'s name for ``strategy`` and its replica count, e.g. ``mirrored, 2 replica(s)``."""
    return f"{strategy_name(strategy)}, {strategy.num_replicas_in_sync} replica(s)"


def _cluster_resolver(strategy):
    """The strategy's cluster resolver when it spans a cluster (``TF_CONFIG``), else None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver if resolver is not None and resolver.task_type else None


def is_chief(strategy):
    """True for the worker that writes checkpoints, summaries and exports (always, without a cluster):
    the ``chief`` task, or worker 0 when the cluster has no chief."""
    resolver = _cluster_resolver(strategy)
    if resolver is None or resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


def workers(strategy):
    """The number of worker processes ``strategy`` spans (1 without a cluster)."""
    resolver = _cluster_resolver(strategy)
    if resolver is None:
        return 1
    return sum(len(tasks) for tasks in resolver.cluster_spec().as_dict().values())


def worker_index(strategy):
    """This process's index among :func:`workers` (0 without a cluster): the chief first, then the workers."""
    resolver = _cluster_resolver(strategy)
    if resolver is None:
        return 0
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    if resolver.task_type == "chief":
        return 0
    return resolver.task_id + int(has_chief)


def any_worker(strategy):
    """``agree(flag) -> bool``: True when ``flag`` is True on any worker.

    With several workers it is a collective (an all-reduce of one number), so
    every worker must call it at the same step; that is how all of them stop
    at the same step when only some received a signal.
    """
    if workers(strategy) == 1:
        return bool

    @tf.function(autograph=False)
    def agree(flag):
        flags = strategy.run(lambda f: tf.cast(f, tf.int32), args=(flag,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None) > 0

    return lambda flag: bool(agree(tf.constant(flag)))


def replica_slice(x, y, replica_id, num_replicas):
    """The rows of a global batch that one replica trains on.

    Rows are split in contiguous runs whose sizes differ by at most one; with
    fewer rows than replicas the last replicas get none.

    Args:
      x: (N, T_x), y: (N, T_y) global batch.
    Returns:
      (x[a:b], y[a:b]) for this replica's [a, b).
    """
    rows = tf.shape(x)[0]
    size, extra = rows // num_replicas, rows % num_replicas
    start = replica_id * size + tf.minimum(replica_id, extra)
    stop = start + size + tf.cast(replica_id < extra, tf.int32)
    return x[start:stop], y[start:stop]


# ---- optimizer and step ---------------------------------------------------------

class _ReducedGradientsAdam(keras.optimizers.Adam):
    """Adam that applies the gradients it is given as they are, in one fused kernel per variable.

    The train step sums the gradients over replicas itself, before clipping and
    the loss-scale finiteness check see them (Keras would clip each replica's
    partial gradient, and sum afterwards), so the optimizer must not sum again.

    Keras' Adam updates ``m``, ``v`` and the variable with about ten element-wise
    ops per variable; ``ResourceApplyAdam`` computes the same update (the bias
    correction folded into the learning rate, epsilon outside the square root) in
    one pass. Dense gradients on one device take it; sparse gradients and
    distributed variables take Keras' own update. Its scalar inputs (the bias
    corrections' powers, the learning rate) are made once an update, not once a
    variable: 130 kernels and a few scalar ops for the small preset's 130 variables.
    """

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # The scalars per dtype, made once an update (not a read of `iterations` and two pows a variable);
        # set past Keras' attribute tracking: a trace-time cache, never part of a checkpoint.
        object.__setattr__(self, "_step_scalars", {})
        try:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        finally:
            object.__setattr__(self, "_step_scalars", None)

    def _scalars(self, dtype, learning_rate):
        """ResourceApplyAdam's scalar inputs in ``dtype``: (beta1_power, beta2_power, lr, beta1, beta2, epsilon)."""
        cache = getattr(self, "_step_scalars", None)
        if cache is not None and dtype in cache:
            return cache[dtype]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        scalars = (tf.pow(beta_1, step), tf.pow(beta_2, step), tf.cast(learning_rate, dtype), beta_1, beta_2,
                   tf.cast(self.epsilon, dtype))
        if cache is not None:
            cache[dtype] = scalars
        return scalars

    def update_step(self, gradient, variable, learning_rate):
        if isinstance(gradient, tf.IndexedSlices) or tf.distribute.has_strategy() or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        beta1_power, beta2_power, lr, beta_1, beta_2, epsilon = self._scalars(dtype, learning_rate)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].handle, v=self._velocities[index].handle,
            beta1_power=beta1_power, beta2_power=beta2_power, lr=lr, beta1=beta_1, beta2=beta_2, epsilon=epsilon,
            grad=tf.cast(gradient, dtype))


def make_optimizer(hp, policy_name=None):
    """Adam with the hparams' schedule, betas, epsilon and ``clip_norm`` (global norm; 0 = off).

    Under ``mixed_float16`` (the global policy, or ``policy_name``) it is wrapped
    in ``keras.optimizers.LossScaleOptimizer``: the step scales the loss, the
    optimizer unscales the gradients and skips steps whose gradients overflowed.
    Create it inside the strategy's scope.
    """
    optimizer = _ReducedGradientsAdam(learning_rate(hp), beta_1=hp.adam_beta1, beta_2=hp.adam_beta2,
                                      epsilon=hp.adam_epsilon, global_clipnorm=hp.clip_norm or None, name="adam")
    policy_name = policy_name or keras.mixed_precision.global_policy().name
    if policy_name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class CompiledUpdate:
    """``update(gradients)``: ``optimizer.apply(gradients, variables())`` compiled by XLA as one function.

    Run op by op, the update of the small preset is 847 ops a step (global-norm
    clipping, one Adam kernel per variable, the schedule, ``iterations``); compiled,
    it is one node of the step's graph whose XLA program runs about three fused loops
    per variable (the norm's sum of squares, then the slots and the weight), with no
    executor work between them. The same variables and slots are updated (checkpoints are unchanged); the
    values equal the op-by-op update's to float32 rounding (XLA sums the global norm in
    its own order). For one device (the default strategy): under ``tf.distribute`` the
    optimizer updates each replica's variables in a cross-replica context, which an XLA
    function cannot enter.

    ``gradients``: one per variable (dense, ``tf.IndexedSlices`` or None), already summed over replicas.
    ``variables``: () -> the trainable variables, read when the update is first traced (a model may build its
    variables in the step's first call). The optimizer is built on them first, as ``apply`` builds it.
    """

    def __init__(self, optimizer, variables):
        self.optimizer, self.variables = optimizer, variables
        self._update = tf.function(self._optimizer_update, jit_compile=True, autograph=False)

    def __call__(self, gradients):
        if not self.optimizer.built:  # before the trace: no variable is created inside the compiled function
            build_optimizer(self.optimizer, self.variables())
        with tf.name_scope(self.optimizer.name):  # the call op: adam/StatefulPartitionedCall
            self._update([_densified(g) for g in gradients])

    def _optimizer_update(self, gradients):  # its name names the XLA module (bench/step_profile.py's category)
        self.optimizer.apply(gradients, self.variables())


def build_optimizer(optimizer, variables):
    """Creates ``optimizer``'s slots for ``variables``, as Keras' ``apply`` does on its first call."""
    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(variables)


def _densified(gradient):
    """``gradient``, an embedding's ``tf.IndexedSlices`` summed into a dense (V, C) tensor.

    Every update path takes dense gradients, so every path is the same Adam:
    the original's (TF1's ``AdamOptimizer`` decays ``m`` and ``v`` and moves
    every row of an embedding, also on a sparse gradient; Keras' sparse
    update differs), clipped by the dense global norm (repeated ids summed
    before squaring, which Keras' clipping of ``IndexedSlices`` does not do).
    And XLA compiles a function once per distinct input shape: a sparse
    gradient has a row per token of the batch, so the compiled update would
    be compiled again for most batches (about 1.5 s each); dense, all share one.
    """
    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


class TrainStep:
    """One compiled training update: ``step(x, y) -> (loss, accuracy)``, updating the weights.

    ``x``: (N, T_x) and ``y``: (N, T_y) int32 global batch. ``loss`` is the mean
    label-smoothed cross-entropy over its non-pad targets and ``accuracy`` the
    share of them predicted right (float32 scalars, computed before the update);
    they stay on the device until read.

    With ``hp.accumulate_steps`` K > 1 one update takes K batches,
    ``step(x1, y1, ..., xK, yK)`` (fewer, at an epoch's end: empty batches fill
    the rest): the gradients of each are summed, its loss divided by the
    non-pad targets of all K (:func:`_targets`), so the update, the loss and
    the accuracy are those of one batch holding the K batches' pairs; the
    batches run one after the other (one batch's activations in memory at a
    time) and the optimizer, its schedule and ``iterations`` count updates.

    The ``tf.function`` has one (None, None) input signature per side, so batches
    of every shape share one trace; :attr:`traces` counts the traces (1 is
    expected when the model and optimizer are built first; otherwise the first
    call creates their variables and traces again). With ``hp.jit_compile`` the forward and backward pass are
    compiled by XLA, which compiles once per distinct shape: feed it batches
    padded to their bucket's bounds (:func:`epoch_batches` does).

    ``fused_update``: the optimizer's update runs as one :class:`CompiledUpdate` (the default strategy
    only). Off by default: one Adam kernel per variable (``ResourceApplyAdam``, one pass over the
    weight and its slots; each can start as soon as its gradient is ready) measured 1.01-1.08x the
    compiled update's whole step on the Zen 5 EPYC and 1.00-1.10x on the earlier ``avx512_bf16`` one;
    XLA's update makes three passes per variable (``docs/benchmarks.md``).
    """

    def __init__(self, model, optimizer, hp, strategy=None, local_batches=False, fused_update=False):
        self.model, self.optimizer, self.hp = model, optimizer, hp
        self.strategy = strategy or tf.distribute.get_strategy()
        if fused_update and strategy_name(self.strategy) != "default":
            raise ValueError(f"fused_update needs the default strategy, not {describe_strategy(self.strategy)}")
        self.fused_update = fused_update
        def variables():
            return model.trainable_variables

        self._apply = (CompiledUpdate(optimizer, variables) if fused_update
                       else lambda gradients: optimizer.apply(gradients, variables()))
        # Each worker feeds its own rows (streamed shards): replicas split their worker's batch.
        self.local_replicas = len(self.strategy.extended.worker_devices) if local_batches else None
        self.least_rows = least_packed_rows(hp, self.local_replicas or self.strategy.num_replicas_in_sync)
        self.traces = 0
        self._gradients = tf.function(self._loss_and_gradients, jit_compile=hp.jit_compile or None,
                                      autograph=False)
        spec = tf.TensorSpec([None, None], tf.int32)
        self._step = tf.function(self._global_step, input_signature=[spec, spec] * hp.accumulate_steps,
                                 autograph=False)

    def __call__(self, *ids):
        """``ids``: x1, y1, x2, y2, ...: at most ``hp.accumulate_steps`` batches, the first ones of one update."""
        if len(ids) % 2 or not 2 <= len(ids) <= 2 * self.hp.accumulate_steps:
            raise ValueError(f"expected 1 to {self.hp.accumulate_steps} (x, y) batches, got {len(ids)} tensors")
        missing = 2 * self.hp.accumulate_steps - len(ids)
        self._build_optimizer()
        return self._step(*ids, *([tf.zeros([0, 1], tf.int32)] * missing if missing else ()))

    def trace(self):
        """Traces the step for its input signature now (else its first call does)."""
        self._build_optimizer()
        self._step.get_concrete_function()

    def _build_optimizer(self):
        """The optimizer's slots made now, eagerly, once the model has been called (so it has all its variables):
        made by Keras' ``apply`` inside the step's first trace instead, they cost about 25 ms of CPU a variable
        (4.5 s for the toy preset's 88 variables, 0.4 s eagerly). A model still to build its variables in the
        step's first call leaves them to ``apply`` there."""
        if not self.optimizer.built and self.model.built:
            with self.strategy.scope():
                build_optimizer(self.optimizer, self.model.trainable_variables)

    def _loss_and_gradients(self, x, y, global_targets):
        """This replica's share of the loss and accuracy, and the gradients of its (scaled) loss."""
        with tf.GradientTape() as tape:
            losses, hits = self.model.target_token_losses(x, y, self.hp.label_smoothing, training=True,
                                                           pack=not self.hp.jit_compile, least_rows=self.least_rows)
            loss = tf.reduce_sum(losses) / global_targets
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.model.trainable_variables)
        return loss, tf.reduce_sum(hits) / global_targets, gradients

    def _replica_batches(self, ids):
        """This replica's rows of each batch of ``ids`` (x1, y1, ...), and the non-pad targets of all of them
        over every replica (float32 scalar, at least 1)."""
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        batches = list(zip(ids[0::2], ids[1::2]))
        global_targets = tf.add_n([_targets(y) for _, y in batches])
        if self.local_replicas:  # the global batch is every worker's: its targets are counted together
            replica = context.replica_id_in_sync_group % self.local_replicas
            batches = [replica_slice(x, y, replica, self.local_replicas) for x, y in batches]
            global_targets = context.all_reduce(tf.distribute.ReduceOp.SUM, global_targets)
        elif replicas > 1:
            batches = [replica_slice(x, y, context.replica_id_in_sync_group, replicas) for x, y in batches]
        return batches, tf.maximum(global_targets, 1.0)

    def _replica_step(self, *ids):
        context = tf.distribute.get_replica_context()
        batches, global_targets = self._replica_batches(ids)
        loss, accuracy, gradients = self._gradients(*batches[0], global_targets)
        for x, y in batches[1:]:
            with tf.control_dependencies(_dense(gradients)):  # one batch after the other: one's activations held
                more = self._gradients(x, y, global_targets)
            loss, accuracy = loss + more[0], accuracy + more[1]
            gradients = [_add_gradients(a, b) for a, b in zip(gradients, more[2])]
        gradients = [_densified(g) for g in gradients]
        if context.num_replicas_in_sync > 1:
            gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        self._apply(gradients)
        return loss, accuracy

    def _global_step(self, *ids):
        self.traces += 1  # Python: runs once per trace, not per step
        loss, accuracy = self.strategy.run(self._replica_step, args=ids)
        total = tf.distribute.ReduceOp.SUM
        return self.strategy.reduce(total, loss, axis=None), self.strategy.reduce(total, accuracy, axis=None)


def least_packed_rows(hp, replicas=1):
    """The least packed row count of a replica's training batch (:class:`~tf_transformer.nn.modules.Packing`'s
    ``least_rows``): half its share of ``hp.batch_tokens``, below the real tokens of a full batch (74-99% of
    ``batch_tokens`` on the debian corpus), so that the partial batches ending each epoch share one count
    instead of bringing a score of new ones to compile (without ``batch_tokens``: ``LEAST_ROWS``)."""
    return max(hp.batch_tokens // (2 * replicas), LEAST_ROWS)


def _dense(gradients):
    """The tensors of ``gradients`` (an ``IndexedSlices``' values), to wait for."""
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients if g is not None]


def _add_gradients(a, b):
    """``a + b``; two ``IndexedSlices`` (an embedding's rows) stay sparse: their rows are concatenated."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _targets(y):
    """The non-pad targets of (N, T) ids, as a float32 scalar."""
    return tf.reduce_sum(tf.cast(tf.not_equal(y, PAD_ID), tf.float32))


def make_train_step(model, optimizer, hp, strategy=None, local_batches=False, fused_update=False):
    """A :class:`TrainStep` (callable ``(x, y) -> (loss, accuracy)``; see there).

    Build ``model`` and ``optimizer`` inside ``strategy.scope()`` when a strategy is given.
    ``local_batches``: each worker of a cluster feeds its own part of the global batch
    (:class:`~tf_transformer.data.shards.ShardedExamples`), not all of it.
    ``fused_update``: see :class:`TrainStep`.
    """
    return TrainStep(model, optimizer, hp, strategy, local_batches, fused_update)


# ---- batches --------------------------------------------------------------------

def epoch_seed(seed, epoch):
    """The shuffle seed of one epoch: every epoch has its own order, fixed by ``seed``."""
    return seed * _EPOCH_SEED_STRIDE + epoch


def pad_to_bucket(hp):
    """A ``tf.data`` map function padding ``(x, y)`` to a finite set of shapes, for XLA.

    Both sides get the length of the smallest bucket bound (``bucket_boundaries``
    - 1, at most ``maxlen``) that holds the batch, and as many rows as a full
    batch of that length has (``batch_tokens // length``, or ``batch_size``);
    the added rows and columns are ``<PAD>``, which the loss ignores.
    """
    lengths = sorted({min(b - 1, hp.maxlen) for b in data_load.bucket_boundaries(hp.maxlen)})
    bounds = tf.constant(lengths, tf.int32)

    def pad(x, y):
        longest = tf.maximum(tf.shape(x)[1], tf.shape(y)[1])
        length = bounds[tf.searchsorted(bounds, longest[None], side="left")[0]]
        rows = hp.batch_tokens // length if hp.batch_tokens else tf.constant(hp.batch_size)
        rows = tf.maximum(rows, tf.shape(x)[0])

        def fill(ids):
            return tf.pad(ids, [[0, rows - tf.shape(ids)[0]], [0, length - tf.shape(ids)[1]]])

        return fill(x), fill(y)

    return pad


def epoch_batches(examples, hp, epoch, skip=0):
    """The training batches of epoch ``epoch`` (0-based) from batch ``skip`` on.

    The order depends only on ``hp.seed`` and ``epoch`` (:func:`epoch_seed`), so a
    run resumed at (epoch, skip) sees exactly the batches the interrupted run
    would have seen next; skipping re-runs the cheap input pipeline only.

    Args:
      examples: :class:`~tf_transformer.data.data_load.Examples`, or the streamed
        :class:`~tf_transformer.data.shards.ShardedExamples`.
    Returns:
      a ``tf.data.Dataset`` of (x, y), padded for XLA when ``hp.jit_compile``; ``tf.data``'s autotuning
      off (:func:`without_autotuning`).
    """
    if isinstance(examples, data_load.Examples):
        dataset = data_load.make_dataset(examples, hp, shuffle=True, seed=epoch_seed(hp.seed, epoch))
        dataset = dataset.skip(skip) if skip else dataset
    else:  # streamed (tf_transformer.data.shards): it starts at the shard holding batch `skip`
        dataset = examples.epoch_batches(hp, epoch, skip)
    return without_autotuning(dataset.map(pad_to_bucket(hp)) if hp.jit_compile else dataset)


def without_autotuning(dataset):
    """``dataset`` with ``tf.data``'s autotuning off. With it, destroying an epoch's iterator (exhausted at the
    epoch's end, or left when a budget or a signal stops a run) waited for its tuning thread: 50.7 s after an
    epoch of the debian corpus read at 20 ms a batch, time the step loop spent between its last step and the
    next, counted in ``train_minutes``. The pipeline takes about 2 ms a batch beside a step of 70 and more."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def count_batches(examples, hp):
    """Batches in one epoch; the same in every epoch (each bucket's batches do not depend on the order)."""
    if not isinstance(examples, data_load.Examples):
        return examples.count_batches(hp)
    return data_load.count_batches(np.bincount(examples.pair_lengths()), hp)


def count_updates(examples, hp):
    """Updates (steps) in one epoch: its batches in groups of ``hp.accumulate_steps``, the last one partial."""
    return -(-count_batches(examples, hp) // hp.accumulate_steps)


def update_groups(batches, hp):
    """The batches of an epoch (from :func:`epoch_batches`) in lists of ``hp.accumulate_steps`` (x, y), one
    list per update; the last list holds the batches left."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == hp.accumulate_steps:
            yield group
            group = []
    if group:
        yield group
