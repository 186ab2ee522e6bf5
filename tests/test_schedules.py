"""Tests for ``NoamSchedule`` (the 2019 ``noam_scheme``), ``label_smoothing``, and the planned
schedules of :mod:`tf_transformer.train.schedules` (alone, in checkpoints and in a budgeted run)."""

import math
import re

import numpy as np
import pytest
import keras
import tensorflow as tf

from helpers import built_model_and_optimizer
from tf_transformer.data import corpus
from tf_transformer.hparams import load_hparams
from tf_transformer.nn.modules import NoamSchedule, label_smoothing
from tf_transformer.train import evaluate, loop, schedules
from tf_transformer.train.checkpoints import Position, TrainingCheckpoints
from tf_transformer.train.run import train
from tf_transformer.train.schedules import PlannedDecay, StepRatePlanner, plan_for_run
from tf_transformer.train.step import TrainStep, learning_rate, make_optimizer


def noam(init_lr, warmup, step):
    """lr = init_lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5), step 1-based."""
    return init_lr * warmup**0.5 * min(step * warmup**-1.5, step**-0.5)


@pytest.mark.parametrize("init_lr,warmup", [(3e-4, 4000), (1e-3, 10), (1.0, 1)])
def test_noam_key_points(init_lr, warmup):
    schedule = NoamSchedule(init_lr, warmup_steps=warmup)
    at = lambda iteration: float(schedule(tf.constant(iteration, tf.int64)))
    # Iteration 0 is step 1.
    assert at(0) == pytest.approx(init_lr / warmup, rel=1e-6)
    assert at(0) == pytest.approx(noam(init_lr, warmup, 1), rel=1e-6)
    # Peak at step == warmup, i.e. iteration warmup - 1.
    assert at(warmup - 1) == pytest.approx(init_lr, rel=1e-6)
    assert at(warmup - 1) == pytest.approx(noam(init_lr, warmup, warmup), rel=1e-6)
    # Step 10 * warmup: decayed by 1/sqrt(10).
    assert at(10 * warmup - 1) == pytest.approx(init_lr / math.sqrt(10), rel=1e-6)
    assert at(10 * warmup - 1) == pytest.approx(noam(init_lr, warmup, 10 * warmup), rel=1e-6)


def test_noam_matches_formula_everywhere():
    init_lr, warmup = 5e-4, 50
    schedule = NoamSchedule(init_lr, warmup_steps=warmup)
    iterations = np.arange(0, 400)
    got = schedule(tf.constant(iterations)).numpy()
    expected = [noam(init_lr, warmup, i + 1) for i in iterations]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # Rises linearly up to the peak, then decays.
    assert np.all(np.diff(got[:warmup]) > 0)
    assert np.all(np.diff(got[warmup - 1 :]) < 0)
    assert np.argmax(got) == warmup - 1


def test_noam_in_optimizer_uses_zero_based_iterations():
    init_lr, warmup = 1e-3, 10
    optimizer = keras.optimizers.Adam(learning_rate=NoamSchedule(init_lr, warmup_steps=warmup))
    assert int(optimizer.iterations) == 0
    assert float(optimizer.learning_rate) == pytest.approx(init_lr / warmup, rel=1e-6)
    var = keras.Variable([1.0, 2.0])
    for _ in range(warmup - 1):
        optimizer.apply_gradients([(tf.constant([0.1, 0.1]), var)])
    assert int(optimizer.iterations) == warmup - 1
    assert float(optimizer.learning_rate) == pytest.approx(init_lr, rel=1e-6)


def test_noam_get_config_round_trip():
    schedule = NoamSchedule(3e-4, warmup_steps=4000)
    config = schedule.get_config()
    assert config == {"init_lr": 3e-4, "warmup_steps": 4000}
    restored = NoamSchedule.from_config(config)
    assert float(restored(123)) == float(schedule(123))
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(again, NoamSchedule) and again.get_config() == config


@pytest.mark.parametrize("epsilon", [0.1, 0.0, 0.3])
def test_label_smoothing_values(epsilon):
    vocab = 5
    ids = np.array([[0, 3, 4], [2, 2, 1]])
    onehot = np.eye(vocab, dtype=np.float64)[ids]
    got = label_smoothing(tf.constant(onehot, tf.float32), epsilon=epsilon).numpy()
    expected = (1 - epsilon) * onehot + epsilon / vocab
    assert got.shape == (2, 3, vocab)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    # Target gets 1 - eps + eps/V, every other class eps/V.
    np.testing.assert_allclose(got[0, 1, 3], 1 - epsilon + epsilon / vocab, atol=1e-7)
    np.testing.assert_allclose(got[0, 1, 0], epsilon / vocab, atol=1e-7)


def test_label_smoothing_default_epsilon_by_hand():
    got = label_smoothing(tf.constant([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])).numpy()
    third = 0.1 / 3
    np.testing.assert_allclose(got, [[third, third, 0.9 + third], [third, 0.9 + third, third]], atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


def test_label_smoothing_of_a_distribution_is_a_distribution():
    probs = tf.nn.softmax(tf.random.stateless_normal([4, 7], seed=[3, 4]))
    got = label_smoothing(probs, epsilon=0.2).numpy()
    np.testing.assert_allclose(got, 0.8 * probs.numpy() + 0.2 / 7, atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


# ---- planned schedules: warm-up, then decay to the floor at the plan's end ----------

def planned(peak, warmup, end, decay, floor=0.0, start=0, iterations=0):
    """The schedule restated in plain Python: step s = iterations + 1 of the plan [start, end]."""
    t, length = iterations + 1 - start, end - start
    w = min(warmup, length / 2)
    if t <= w:
        return peak * t / w
    p = min((t - w) / (length - w), 1.0)
    shape = 1 - p if decay == "linear" else (1 + math.cos(math.pi * p)) / 2
    return floor + (peak - floor) * shape


@pytest.mark.parametrize("decay", ["linear", "cosine"])
@pytest.mark.parametrize("floor", [0.0, 1e-5])
def test_planned_decay_key_points(decay, floor):
    peak, warmup, end = 1e-3, 10, 110
    at = lambda i: float(PlannedDecay(peak, warmup, end, decay, floor)(i))
    assert at(0) == pytest.approx(peak / warmup, rel=1e-6)
    assert at(warmup - 1) == pytest.approx(peak, rel=1e-6)  # warm-up end: the peak
    # A quarter into the decay (step 35 of 10..110): 3/4 of the way down, or cos^2(pi/8).
    quarter = 0.75 if decay == "linear" else math.cos(math.pi / 8) ** 2
    assert at(34) == pytest.approx(floor + (peak - floor) * quarter, rel=1e-5)
    assert at(59) == pytest.approx(floor + (peak - floor) / 2, rel=1e-5)  # mid-decay: halfway, either shape
    assert at(end - 1) == pytest.approx(floor, abs=1e-9)  # the plan's last step
    assert at(end) == at(10 * end) == pytest.approx(floor, abs=1e-9)  # past the end
    got = PlannedDecay(peak, warmup, end, decay, floor)(tf.range(200)).numpy()
    np.testing.assert_allclose(got, [planned(peak, warmup, end, decay, floor, iterations=i) for i in range(200)],
                               rtol=1e-5, atol=1e-9)


def test_planned_decay_short_plan_restart_and_no_plan():
    # A plan shorter than twice the warm-up warms up over half of it.
    assert float(PlannedDecay(1.0, 400, 100)(49)) == pytest.approx(1.0)
    assert float(PlannedDecay(1.0, 400, 100)(74)) == pytest.approx(0.5, rel=1e-5)
    # A plan restarted at step 1000 is the same schedule, 1000 steps later.
    restarted = PlannedDecay(1e-3, 10, 1110, "cosine", start_step=1000)(tf.range(1000, 1200)).numpy()
    np.testing.assert_allclose(restarted, PlannedDecay(1e-3, 10, 110, "cosine")(tf.range(200)).numpy(), rtol=1e-5)
    # Without a plan: the warm-up, then the peak.
    np.testing.assert_allclose(PlannedDecay(2.0, 4)(tf.range(8)).numpy(), [0.5, 1, 1.5, 2, 2, 2, 2, 2])


def test_planned_decay_get_config_round_trip():
    schedule = PlannedDecay(3e-4, 50, 1234, "cosine", 1e-6, start_step=17)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(again, PlannedDecay) and again.get_config() == schedule.get_config()
    assert again.get_config()["planned_steps"] == 1234 and again.get_config()["start_step"] == 17


def test_the_compiled_step_reads_the_plan_set_after_tracing():
    schedule = PlannedDecay(1e-3, 2, decay="linear")
    optimizer = keras.optimizers.Adam(schedule)
    var = keras.Variable([1.0])
    optimizer.build([var])

    @tf.function
    def step():
        rate = optimizer.learning_rate
        optimizer.apply([tf.constant([0.1])], [var])
        return rate

    assert [float(step()) for _ in range(4)] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3])  # no plan: the peak
    schedule.planned_steps.assign(12)  # iterations 4..11 decay over steps 3..12
    assert float(step()) == pytest.approx(planned(1e-3, 2, 12, "linear", iterations=4), rel=1e-6)
    assert step.experimental_get_tracing_count() == 1


def test_learning_rate_dispatches_the_planned_schedules():
    hp = load_hparams("toy", overrides=["lr_schedule=cosine", "learning_rate=0.002", "warmup_steps=7"])
    schedule = learning_rate(hp)
    assert isinstance(schedule, PlannedDecay)
    assert (schedule.peak_lr, schedule.warmup_steps, schedule.decay, schedule.floor) == (0.002, 7, "cosine", 0.0)
    assert schedules.schedule_of(make_optimizer(hp)) is not None
    assert schedules.schedule_of(make_optimizer(hp, policy_name="mixed_float16")) is not None
    assert schedules.schedule_of(make_optimizer(hp.replace(lr_schedule="noam"))) is None


def test_the_plan_is_saved_and_restored_with_the_checkpoints(tmp_path):
    hp = load_hparams("toy", overrides=["lr_schedule=linear", "num_blocks=1", "num_units=8", "d_ff=8"])

    def restored(directory, plan=None):
        """As train.py: restore, then attach the plan (restored on attaching when the checkpoint has one)."""
        model, optimizer = built_model_and_optimizer(hp, 11)
        checkpoints = TrainingCheckpoints(str(directory), model, optimizer, "fingerprint", 2)
        checkpoints.restore_latest(print)
        schedule = schedules.schedule_of(optimizer)
        if plan is not None:
            schedule.planned_steps.assign(plan[0])
            schedule.start_step.assign(plan[1])
        checkpoints.attach("lr_plan", schedule.plan_variables())
        return checkpoints, schedule

    checkpoints, _ = restored(tmp_path, plan=(345, 12))
    checkpoints.save(Position(step=20))
    _, schedule = restored(tmp_path)
    assert (int(schedule.planned_steps.numpy()), int(schedule.start_step.numpy())) == (345, 12)
    # A checkpoint written before plans existed (or under noam) resumes too, without a plan.
    model, optimizer = built_model_and_optimizer(hp.replace(lr_schedule="noam"), 11)
    TrainingCheckpoints(str(tmp_path / "old"), model, optimizer, "fingerprint", 2).save(Position(step=5))
    checkpoints, schedule = restored(tmp_path / "old")
    assert checkpoints.position.step == 5 and int(schedule.planned_steps.numpy()) == 0


def test_the_planner_turns_the_measured_rate_into_steps():
    planner = StepRatePlanner(budget_seconds=100.0, max_steps=10_000, measure_steps=4)
    clock, synced = iter([10.0, 12.0]), []  # step 1 ends 10 s in (the trace); steps 2-5 take 2 s
    observe = lambda step: planner.observe(step, lambda: next(clock), lambda: synced.append(step))
    assert [observe(step) for step in range(1, 5)] == [None] * 4
    assert observe(5) == 5 + 2 * 88  # 2 steps/s for the 88 s left
    assert (planner.rate, synced) == (2.0, [1, 5])
    assert observe(6) is None
    capped = StepRatePlanner(100.0, max_steps=50, measure_steps=1)
    clock = iter([0.0, 1.0])
    assert [capped.observe(s, lambda: next(clock)) for s in (1, 2)] == [None, 50]


def test_plan_for_run_keeps_restarts_or_measures():
    schedule = PlannedDecay(1e-3, 10)
    assert plan_for_run(schedule, 0, max_steps=500, budget_seconds=0) is None  # no budget: the epochs
    assert int(schedule.planned_steps.numpy()) == 500
    schedule.planned_steps.assign(300)
    assert plan_for_run(schedule, 120, 500, budget_seconds=60) is None  # interrupted before its end: kept
    assert int(schedule.planned_steps.numpy()) == 300
    planner = plan_for_run(schedule, 300, 500, budget_seconds=60)  # done, a fresh budget: a new plan at 300
    assert isinstance(planner, StepRatePlanner) and planner.max_steps == 500
    assert (int(schedule.start_step.numpy()), int(schedule.planned_steps.numpy())) == (300, 0)
    assert plan_for_run(PlannedDecay(1e-3, 10), 0, 500, budget_seconds=60) is not None  # no plan yet: measured


def budgeted_toy_run(model_dir, monkeypatch, seconds_per_step, minutes):
    """A toy run with ``lr_schedule=linear`` whose budget clock advances ``seconds_per_step`` a step
    (so the measured rate, and the plan, do not depend on the machine); returns (result, log lines)."""
    steps = [0]
    call = TrainStep.__call__

    def counted(self, x, y):
        steps[0] += 1
        return call(self, x, y)

    monkeypatch.setattr(TrainStep, "__call__", counted)
    monkeypatch.setattr(loop.StepLoop, "budget_clock", lambda self: seconds_per_step * steps[0])
    monkeypatch.setattr(schedules, "PLAN_AFTER_STEPS", 4)
    # The schedule is the subject: no dev evaluation at the end (it takes longer than the steps).
    monkeypatch.setattr(evaluate.Evaluator, "finish", lambda self, step, samples: evaluate.Final())
    hp = load_hparams("toy", overrides=["num_epochs=1000", f"train_minutes={minutes}", "eval_every_epochs=0",
                                        "lr_schedule=linear", "warmup_steps=5", "batch_size=1"])
    lines = []
    result = train(hp, corpus.corpus_splits("toy"), model_dir, log=lines.append, samples=0, export=False)
    return result, lines


def plan_of(lines):
    """(first step, last step) of the last plan logged."""
    plans = [re.search(r"^learning-rate plan: .* from step (\d+) to step (\d+) ", line) for line in lines]
    plans = [tuple(map(int, m.groups())) for m in plans if m]
    assert plans, lines
    return plans[-1]


def test_a_budgeted_run_plans_decays_to_the_floor_and_a_fresh_budget_plans_anew(tmp_path, monkeypatch):
    model_dir = str(tmp_path)
    # 0.1 s a step, 0.03 minutes: the rate of steps 2-5 (10/s) times the 1.3 s left after step 5 -> step 18.
    result, lines = budgeted_toy_run(model_dir, monkeypatch, 0.1, 0.03)
    assert plan_of(lines) == (0, 18)
    assert any(re.match(r"learning-rate plan: warm-up then linear decay to 0 from step 0 to step 18 "
                        r"\(10\.0 steps/s over 4 steps", line) for line in lines), lines
    assert result.step == 18  # stopped at the plan's end (1.8 s of the 1.8 s budget)
    last = [float(m.group(1)) for m in (re.match(r"learning-rate plan ended at step 18: last learning rate (\S+)$",
                                                 line) for line in lines) if m]
    assert last == [pytest.approx(0.0, abs=1e-9)]  # the floor
    latest = tf.train.latest_checkpoint(model_dir)
    assert tf.train.load_variable(latest, "lr_plan/planned_steps/.ATTRIBUTES/VARIABLE_VALUE") == 18

    # Resumed with a fresh budget after the plan's end: a new plan from step 18, over the new budget.
    again, lines = budgeted_toy_run(model_dir, monkeypatch, 0.1, 0.03)
    assert plan_of(lines) == (18, 36) and again.step == 36
