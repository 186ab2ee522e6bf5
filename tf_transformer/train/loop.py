"""The training step loop: epochs of compiled steps, checkpoints, the time budget, signals, divergence.

:class:`StepLoop` runs the steps of a prepared run (model, optimizer,
checkpoints and the position to start from are its inputs) to the end of
``num_epochs``, or until ``train_minutes`` of training steps are spent. Along
the way it saves a checkpoint every ``save_every_steps`` steps, every
``save_every_secs`` seconds and at each epoch end; reads the loss from the
device every :data:`READ_EVERY_STEPS` steps for the progress bar and the
TensorBoard scalars; stops with :class:`Diverged` at the first non-finite loss
or weight, before any checkpoint holds it; and on SIGINT/SIGTERM saves and
raises :class:`~tf_transformer.train.checkpoints.Interrupted`. Every
``eval_every_epochs`` epochs it calls the ``evaluate`` it was given. The
first batch of a run is read while the step is traced
(:func:`fetching_first_during`).

:class:`LearningRatePlan` is the ``train_minutes`` learning-rate plan of a
:class:`~tf_transformer.train.schedules.PlannedDecay` schedule: fixed from the
measured step rate once the first steps are timed, saved with the checkpoints.
"""

import signal
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from tf_transformer.data import data_load
from tf_transformer.errors import UserError
from tf_transformer.train import schedules
from tf_transformer.train.checkpoints import Interrupted, Position
from tf_transformer.train.step import any_worker, epoch_batches, update_groups, workers

# Loss and accuracy are read from the device once per this many steps (and at each epoch end).
READ_EVERY_STEPS = 20


def fetching_first_during(dataset, work):
    """Iterates ``dataset``, its first element fetched in a thread while ``work()`` runs.

    ``tf.data`` fills its buffers (a streamed shard's shuffle buffer: seconds)
    in C++ threads, so this overlaps with Python's tracing of the step.
    """
    iterator, first = iter(dataset), {}

    def fetch():
        try:
            first["batch"] = next(iterator)
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 -- raised again in the caller's thread
            first["error"] = e

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    work()
    thread.join()
    if "error" in first:
        raise first["error"]
    if "batch" in first:
        yield first["batch"]
        yield from iterator


class Diverged(UserError):
    """The loss or the weights became NaN or Inf; nothing was saved from them."""


def finite_check(variables):
    """A function of no arguments returning whether every value of ``variables`` is finite: one traced call (its
    variables captured, not passed: checking dozens of arguments costs more than the call), one device sync."""
    return tf.function(lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables]),
                       autograph=False)


class _Window:
    """The loss/accuracy tensors of the steps since the last read from the device."""

    def __init__(self, stats):
        self.losses, self.accuracies = [], []
        self.stats, self.tokens, self.started = stats, stats.target_tokens, time.monotonic()

    def add(self, loss, accuracy):
        self.losses.append(loss)
        self.accuracies.append(accuracy)

    def read(self):
        """(per-step losses, per-step accuracies, target tokens/s) as numpy; one device sync."""
        losses, accuracies = tf.stack(self.losses).numpy(), tf.stack(self.accuracies).numpy()
        seconds = max(time.monotonic() - self.started, 1e-9)
        return losses, accuracies, (self.stats.target_tokens - self.tokens) / seconds


class LearningRatePlan:
    """The learning-rate plan of a run whose optimizer has a :class:`~tf_transformer.train.schedules.PlannedDecay`
    schedule (none otherwise: :attr:`schedule` None, :attr:`end` 0).

    Attaches the plan's variables to ``checkpoints`` (restored there when the checkpoint has them) and
    plans the run from ``step`` (:func:`~tf_transformer.train.schedules.plan_for_run`).

    Args:
      optimizer: the run's optimizer.
      checkpoints: the run's :class:`~tf_transformer.train.checkpoints.TrainingCheckpoints`, restored.
      step: the step the run starts from.
      max_steps: ``num_epochs`` x updates per epoch.
      train_minutes: the run's budget (0: none).
      log: ``callable(str)``.
    Attributes:
      end: the plan's last step, also in Python so that the step loop does not read the device
        (0: no plan yet).
      planner: the :class:`~tf_transformer.train.schedules.StepRatePlanner` still timing steps, else None.
    """

    def __init__(self, optimizer, checkpoints, step, max_steps, train_minutes, log):
        self.schedule, self.planner, self.end = schedules.schedule_of(optimizer), None, 0
        self.train_minutes = train_minutes
        if self.schedule is None:
            return
        # Saved with the checkpoints, and restored on attaching when the restored one has it (attached
        # later, checkpoints without one still match).
        checkpoints.attach("lr_plan", self.schedule.plan_variables())
        self.planner = schedules.plan_for_run(self.schedule, step, max_steps, 60.0 * train_minutes)
        self.end = int(self.schedule.planned_steps.numpy())
        if self.planner is None:
            self.announce(log, "kept from the checkpoint" if train_minutes else "num_epochs x batches per epoch")

    def observe(self, step, loss, clock, strategy, workers, progress, log):
        """Fixes the plan once the planner has timed its steps (the workers agree on it)."""
        planned = self.planner.observe(step, clock, sync=loss.numpy)
        if planned is None:
            return
        if workers > 1:
            planned = schedules.mean_over_workers(strategy, planned)
        self.schedule.planned_steps.assign(planned)
        self.end = planned
        progress.set_total(planned)
        self.announce(log, f"{self.planner.rate:.1f} steps/s over {self.planner.measure_steps} steps, "
                           f"train_minutes={self.train_minutes:g}")
        self.planner = None

    def announce(self, log, reason):
        """Logs the plan, and why it is so."""
        s = self.schedule
        log(f"learning-rate plan: warm-up then {s.decay} decay to {s.floor:g} from step "
            f"{int(s.start_step.numpy())} to step {int(s.planned_steps.numpy())} ({reason})")

    def stop_at(self, step, log):
        """Where the budget ends a run, its plan ends too (a run resumed with a fresh budget then plans anew);
        logs the last step's learning rate."""
        if not self.end:
            return
        log(f"learning-rate plan ended at step {step}: last learning rate {float(self.schedule(step - 1)):.3g}")
        self.end = min(step, self.end)
        self.schedule.planned_steps.assign(self.end)


class StepLoop:
    """Trains from ``position`` to the end of the run; see the module docstring.

    Args:
      hp: :class:`~tf_transformer.hparams.HParams`.
      examples: the encoded training pairs (:func:`~tf_transformer.data.data_load.encode_pairs`), or the
        streamed :class:`~tf_transformer.data.shards.ShardedExamples`.
      model, optimizer: built under ``strategy``.
      train_step: :func:`~tf_transformer.train.step.make_train_step` of them.
      checkpoints: :class:`~tf_transformer.train.checkpoints.TrainingCheckpoints`, restored.
      position: where to start (:class:`~tf_transformer.train.checkpoints.Position`).
      plan: :class:`LearningRatePlan`.
      strategy: the ``tf.distribute`` strategy.
      summaries: :class:`~tf_transformer.train.summaries.Summaries`.
      progress: :class:`~tf_transformer.progress.Progress`.
      log: ``callable(str)``.
      save_every_secs: also save when this many seconds passed since the last save (0: off).
      evaluate: ``callable(step)`` run every ``eval_every_epochs`` epochs (None: no evaluation).
    Attributes:
      position: where training stands.
      out_of_time: ``train_minutes`` ended the run.
    """

    def __init__(self, hp, examples, model, optimizer, train_step, checkpoints, position, plan, strategy, summaries,
                 progress, log, save_every_secs=0.0, evaluate=None):
        self.hp, self.examples, self.model, self.optimizer = hp, examples, model, optimizer
        self.train_step, self.checkpoints, self.position, self.plan = train_step, checkpoints, position, plan
        self.strategy, self.summaries, self.progress, self.log = strategy, summaries, progress, log
        self.save_every_secs, self.evaluate = save_every_secs, evaluate
        self.workers = workers(strategy)  # read once: the loop asks every step
        self.agree = any_worker(strategy)
        # Loss scaling skips the steps whose gradients overflow: a non-finite loss there is no divergence.
        self.loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.weights_finite = finite_check(model.trainable_variables)
        self.last_save, self.last_finite = time.monotonic(), None
        self.train_seconds, self.epoch_started, self.out_of_time = 0.0, time.monotonic(), False

    def save(self, position):
        """Saves a checkpoint at ``position``, unless the weights are no longer finite (:class:`Diverged`)."""
        if not bool(self.weights_finite()):
            raise self.diverged(position.step, "the weights are no longer finite (NaN or Inf)")
        self.last_save = time.monotonic()
        return self.checkpoints.save(position)

    def diverged(self, step, what):
        """The :class:`Diverged` error of ``what`` happening at ``step``, with the last finite loss and a hint."""
        last = "no finite loss before" if self.last_finite is None else \
            f"last finite loss {self.last_finite[1]:.4f} at step {self.last_finite[0]}"
        kept = self.checkpoints.latest
        kept = f"kept {kept}, the last checkpoint, whose weights are finite" if kept else "no checkpoint was saved"
        return Diverged(f"training diverged at step {step}: {what} ({last}); {kept}; nothing was saved from "
                        f"non-finite weights. Run again with a lower learning_rate (now {self.hp.learning_rate:g}) "
                        f"or a clip_norm (e.g. --set clip_norm=1.0) to resume from there, or with --restart")

    def check_losses(self, losses, first):
        """Raises :class:`Diverged` at the first non-finite loss of steps ``first``, ``first + 1``, ...
        (not under loss scaling, which skips such steps); remembers the last finite one."""
        finite = np.isfinite(losses)
        if not finite.all() and not self.loss_scaled:
            bad = int(np.argmin(finite))
            raise self.diverged(first + bad, f"loss {losses[bad]}")
        if finite.any():
            last = int(np.flatnonzero(finite)[-1])
            self.last_finite = (first + last, float(losses[last]))

    def train_epoch(self, stop):
        """Trains from ``self.position`` to the end of its epoch, or until the ``train_minutes``
        budget is spent (:attr:`out_of_time`); returns (mean loss, mean accuracy, stats)."""
        hp, start = self.hp, self.position
        step, batch, save_due = start.step, start.batch, False
        stats = data_load.BatchStats()
        window, epoch_losses, epoch_accuracies = _Window(stats), [], []
        batches = epoch_batches(self.examples, hp, start.epoch, start.batch)
        if not self.train_step.traces:  # trace the step while the first batch is read
            batches = fetching_first_during(batches, self.train_step.trace)
        for group in update_groups(batches, hp):
            if save_due:  # the losses so far are read first: a checkpoint never follows a NaN loss
                if window.losses:
                    epoch_losses, epoch_accuracies = self.report(window, step, epoch_losses, epoch_accuracies)
                    window = _Window(stats)
                self.save(Position(step, start.epoch, batch))
                save_due = False
            loss, accuracy = self.train_step(*[ids for pair in group for ids in pair])
            window.add(loss, accuracy)
            for x, y in group:
                stats.add(x, y)
            step, batch = step + 1, batch + len(group)
            if self.plan.planner is not None:
                self.plan.observe(step, loss, self.budget_clock, self.strategy, self.workers, self.progress,
                                  self.log)
            if len(window.losses) == READ_EVERY_STEPS:
                epoch_losses, epoch_accuracies = self.report(window, step, epoch_losses, epoch_accuracies)
                window = _Window(stats)
            save_due = ((hp.save_every_steps and step % hp.save_every_steps == 0) or
                        (self.save_every_secs and time.monotonic() - self.last_save >= self.save_every_secs))
            if self.stop_due(stop, step):
                raise Interrupted(stop.signum or signal.SIGTERM, self.save(Position(step, start.epoch, batch)))
            if self.budget_spent(step):
                self.out_of_time = True
                self.plan.stop_at(step, self.log)
                self.position = Position(step, start.epoch, batch)
                break
        if window.losses:
            epoch_losses, epoch_accuracies = self.report(window, step, epoch_losses, epoch_accuracies)
        if not self.out_of_time:
            self.position = Position(step, start.epoch + 1, 0)
        return np.mean(epoch_losses) if epoch_losses else float("nan"), \
            np.mean(epoch_accuracies) if epoch_accuracies else float("nan"), stats

    def budget_clock(self):
        """Seconds of training steps in this run so far (what ``train_minutes`` counts)."""
        return self.train_seconds + time.monotonic() - self.epoch_started

    def budget_spent(self, step):
        """Whether ``train_minutes`` of training steps have passed in this run, or the learning-rate
        plan is done. Workers of a cluster decide together every ``READ_EVERY_STEPS`` steps, as for signals."""
        if not self.hp.train_minutes:
            return False
        if 0 < self.plan.end <= step:
            return True
        spent = self.budget_clock() >= 60.0 * self.hp.train_minutes
        if self.workers == 1:
            return spent
        return step % READ_EVERY_STEPS == 0 and self.agree(spent)

    def stop_due(self, stop, step=None):
        """Whether to save and stop now. Workers of a cluster decide together every
        ``READ_EVERY_STEPS`` steps and at epoch ends (``step`` None), so that they
        all stop at the same step even when only some of them got the signal."""
        if self.workers == 1:
            return stop.signum is not None
        return (step is None or step % READ_EVERY_STEPS == 0) and self.agree(stop.signum is not None)

    def report(self, window, step, epoch_losses, epoch_accuracies):
        """Reads a window from the device: progress bar, per-step TensorBoard scalars."""
        losses, accuracies, tokens_per_sec = window.read()
        lr = float(tf.convert_to_tensor(self.optimizer.learning_rate))
        first = step - len(losses) + 1
        self.check_losses(losses, first)
        for i, (loss, accuracy) in enumerate(zip(losses, accuracies)):
            self.summaries.scalars(first + i, **{"train/loss": loss, "train/accuracy": accuracy})
        self.summaries.scalars(step, **{"train/learning_rate": lr, "train/target_tokens_per_sec": tokens_per_sec})
        self.progress.update(len(losses), loss=float(np.mean(losses)), lr=lr, tokens_per_sec=tokens_per_sec)
        return epoch_losses + list(losses), epoch_accuracies + list(accuracies)

    def log_epoch(self, loss, accuracy, stats, seconds):
        """One line per epoch (per tenth of the run when there are more than ten), and one for the
        part of an epoch that ``train_minutes`` cut short."""
        hp, done = self.hp, self.position.epoch
        if not self.out_of_time and done % max(1, hp.num_epochs // 10) and done != hp.num_epochs:
            return
        padding = stats.summary(hp.maxlen)
        epoch = f"epoch {done + 1}/{hp.num_epochs} (to batch {self.position.batch})" if self.out_of_time else \
            f"epoch {done}/{hp.num_epochs}"
        steps = f"{stats.batches} steps" if hp.accumulate_steps == 1 else \
            f"{-(-stats.batches // hp.accumulate_steps)} steps of {hp.accumulate_steps} batches"
        self.log(f"{epoch}: loss {loss:.4f}, accuracy {accuracy:.3f}, "
                 f"{steps} in {seconds:.2f}s ({stats.target_tokens / max(seconds, 1e-9):.0f} "
                 f"target tokens/s, {padding['padding']:.0%} padding, {padding.get('padding_at_maxlen', 0):.0%} "
                 f"if padded to maxlen); train step traced {self.train_step.traces} time(s)")

    def run(self, stop):
        """Trains to the end of ``num_epochs`` or of the budget; returns the last :class:`Position`.

        Raises:
          Interrupted: ``stop`` got a signal; a checkpoint was saved first.
          Diverged: the loss or the weights became non-finite.
        """
        hp = self.hp
        eval_every = hp.eval_every_epochs
        while self.position.epoch < hp.num_epochs:
            self.epoch_started = time.monotonic()
            loss, accuracy, stats = self.train_epoch(stop)
            seconds = time.monotonic() - self.epoch_started
            self.train_seconds += seconds
            self.log_epoch(loss, accuracy, stats, seconds)
            self.save(self.position)
            if self.out_of_time:
                p = self.position
                self.log(f"train_minutes={hp.train_minutes:g} spent: stopped at step {p.step} "
                         f"(epoch {p.epoch + 1}, batch {p.batch}) after {self.train_seconds / 60:.1f} minutes of "
                         f"training")
                return self.position
            if (self.evaluate is not None and eval_every and self.position.epoch % eval_every == 0
                    and self.position.epoch < hp.num_epochs):
                self.evaluate(self.position.step)
            if self.stop_due(stop):
                raise Interrupted(stop.signum or signal.SIGTERM, self.checkpoints.latest)
        return self.position
