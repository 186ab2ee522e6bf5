"""Learning-rate schedules made for a run of known length, and the plan that fixes that length.

* :class:`PlannedDecay`: linear warm-up to the peak, then linear or cosine
  decay that reaches its floor at the planned last step. The plan (its first
  and last step) lives in two ``tf.Variable`` s, so a checkpoint that tracks
  :meth:`PlannedDecay.plan_variables` stores it and a resumed run reads it back,
  and the compiled train step reads the current plan at every step.
* :class:`StepRatePlanner`: with a ``train_minutes`` budget, measures the
  step rate over the first steps of a run (after the first, which traces and
  compiles) and turns the rest of the budget into a number of steps.
* :func:`plan_for_run`: what a (possibly resumed) run does with the plan it
  restored; see there for resuming with a fresh budget.
"""

import math

import keras
import tensorflow as tf

DECAYS = ("linear", "cosine")
# Steps timed (after the first one of a run) before a budgeted run fixes its plan.
PLAN_AFTER_STEPS = 40


@keras.saving.register_keras_serializable(package="tf_transformer")
class PlannedDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Warm-up, then decay to ``floor`` at the end of the plan.

    With ``s = iterations + 1`` (1-based, as :class:`~tf_transformer.nn.modules.NoamSchedule`),
    the plan's first step ``a`` (``start_step``, 0 unless a run restarted the plan)
    and last step ``b`` (``planned_steps``), the run's steps ``t = s - a`` of
    ``L = b - a``, and the warm-up ``w = min(warmup_steps, L / 2)``::

      lr = peak * t / w                                     t <= w
      lr = floor + (peak - floor) * f((t - w) / (L - w))    w < t <= L
      lr = floor                                            t > L

    with ``f(p) = 1 - p`` (linear) or ``f(p) = (1 + cos(pi * p)) / 2`` (cosine).
    Before a plan exists (``planned_steps`` 0) the rate rises over
    ``warmup_steps`` and then stays at the peak.

    Examples:
      >>> schedule = PlannedDecay(1e-3, warmup_steps=10, planned_steps=110)
      >>> [round(float(schedule(i)), 6) for i in (9, 59, 109, 500)]
      [0.001, 0.0005, 0.0, 0.0]
    """

    def __init__(self, peak_lr, warmup_steps, planned_steps=0, decay="linear", floor=0.0, start_step=0):
        if decay not in DECAYS:
            raise ValueError(f"decay={decay!r}: one of {', '.join(DECAYS)}")
        self.peak_lr, self.warmup_steps, self.decay, self.floor = peak_lr, warmup_steps, decay, floor
        self.planned_steps = tf.Variable(planned_steps, dtype=tf.int64, trainable=False, name="planned_steps")
        self.start_step = tf.Variable(start_step, dtype=tf.int64, trainable=False, name="start_step")

    def plan_variables(self):
        """``{"planned_steps": ..., "start_step": ...}``: the variables a checkpoint must track."""
        return {"planned_steps": self.planned_steps, "start_step": self.start_step}

    def __call__(self, iterations):
        t = tf.cast(iterations, tf.float32) + 1.0 - tf.cast(self.start_step, tf.float32)
        length = tf.cast(self.planned_steps, tf.float32) - tf.cast(self.start_step, tf.float32)
        planned = self.planned_steps > 0
        warmup = tf.where(planned, tf.minimum(float(self.warmup_steps), length / 2.0), float(self.warmup_steps))
        warmup = tf.maximum(warmup, 1.0)
        progress = tf.clip_by_value((t - warmup) / tf.maximum(length - warmup, 1.0), 0.0, 1.0)
        if self.decay == "linear":
            remaining = 1.0 - progress
        else:
            remaining = 0.5 * (1.0 + tf.cos(math.pi * progress))
        decayed = self.floor + (self.peak_lr - self.floor) * tf.where(planned, remaining, 1.0)
        return tf.where(t <= warmup, self.peak_lr * tf.maximum(t, 0.0) / warmup, decayed)

    def get_config(self):
        return {"peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps,
                "planned_steps": int(self.planned_steps.numpy()), "decay": self.decay, "floor": self.floor,
                "start_step": int(self.start_step.numpy())}


class StepRatePlanner:
    """Fixes the last step of a budgeted run from its measured step rate.

    Call :meth:`observe` after every training step. The first call starts the
    clock (after the step that traced and compiled); :data:`PLAN_AFTER_STEPS`
    steps later the rate of those steps, times the budget left, gives the plan.

    Args:
      budget_seconds: the run's budget (``60 * train_minutes``).
      max_steps: the plan's upper bound (``num_epochs`` x batches per epoch).
      measure_steps: steps timed (default :data:`PLAN_AFTER_STEPS`).
    """

    def __init__(self, budget_seconds, max_steps, measure_steps=None):
        self.budget_seconds, self.max_steps = budget_seconds, max_steps
        self.measure_steps = measure_steps or PLAN_AFTER_STEPS
        self.rate = self.planned_steps = None
        self._start = None

    def observe(self, step, clock, sync=lambda: None):
        """Returns the planned last step once, when it is fixed; else None.

        Args:
          step: training steps done (all runs together).
          clock: ``() -> seconds`` of this run's budget spent so far.
          sync: ``() -> None`` that waits for the step to finish (e.g. reads its loss);
            called only at the two ends of the timed steps.
        """
        if self.planned_steps is not None:
            return None
        if self._start is None:
            sync()
            self._start = (step, clock())
            return None
        if step - self._start[0] < self.measure_steps:
            return None
        sync()
        now = clock()
        self.rate = (step - self._start[0]) / max(now - self._start[1], 1e-9)
        left = max(self.budget_seconds - now, 0.0)
        self.planned_steps = min(self.max_steps, step + round(self.rate * left))
        return self.planned_steps


def plan_for_run(schedule, step, max_steps, budget_seconds):
    """Sets ``schedule``'s plan for a run starting (or resuming) at ``step``; returns a
    :class:`StepRatePlanner` when the plan is still to be measured, else None.

    * No budget: the plan ends at ``max_steps`` (``num_epochs`` x batches per epoch).
    * A budget and a restored plan that ``step`` has not reached (a run
      interrupted before its end): the plan is kept; the run stops at its end.
    * A budget and no plan yet: measured (:class:`StepRatePlanner`).
    * A budget and a plan already done (the run is resumed with a fresh
      budget to train longer): a new plan starts at ``step`` (warm-up again,
      then decay to the floor when the new budget ends), measured.
    """
    if not budget_seconds:
        schedule.planned_steps.assign(max_steps)
        return None
    planned = int(schedule.planned_steps.numpy())
    if step < planned:
        return None
    if planned:
        schedule.start_step.assign(step)
        schedule.planned_steps.assign(0)
    return StepRatePlanner(budget_seconds, max_steps)


def schedule_of(optimizer):
    """The :class:`PlannedDecay` that ``optimizer`` (or the one a ``LossScaleOptimizer``
    wraps) follows, else None. Keras keeps a schedule, unchanged, in ``_learning_rate``."""
    schedule = getattr(getattr(optimizer, "inner_optimizer", optimizer), "_learning_rate", None)
    return schedule if isinstance(schedule, PlannedDecay) else None


def mean_over_workers(strategy, value):
    """The mean of ``value`` (a number each worker measured) over the replicas of all
    workers, rounded: one all-reduce, so every worker calls it at the same step."""
    @tf.function(autograph=False)
    def mean(x):
        per_replica = strategy.run(tf.identity, args=(x,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return int(round(float(mean(tf.constant(float(value), tf.float64)))))
