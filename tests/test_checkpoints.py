"""Training checkpoints: what they hold, rotation, damaged checkpoints, signals, incompatible directories."""

import gc
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from helpers import built_model_and_optimizer, fill, padded_ids, small_disk
from tf_transformer.data import corpus
from tf_transformer.errors import UserError
from tf_transformer.hparams import load_hparams
from tf_transformer.train.checkpoints import Interrupted, Position, StopRequest, TrainingCheckpoints
from tf_transformer.train.run import train

VOCAB = 17
HP = load_hparams("toy", overrides=["num_blocks=1", "num_units=16", "num_heads=2", "d_ff=32",
                                    "dropout_rate=0.2", "residual_dropout_rate=0.1"])


def build(seed):
    return built_model_and_optimizer(HP, VOCAB, seed)


def state(model, optimizer):
    return [v.numpy() for v in model.variables + optimizer.variables]


@pytest.fixture(scope="module")
def trained():
    """A model and optimizer after a few steps (moments, iterations and dropout seeds all moved)."""
    model, optimizer = build(seed=1)
    x, y = tf.constant(padded_ids(0, [4, 2, 5], 5, VOCAB)), tf.constant(padded_ids(1, [3, 5, 1], 5, VOCAB))

    def step():
        model((x, y), training=True)  # draws dropout masks: the seed states move
        optimizer.apply([tf.random.normal(v.shape) for v in model.trainable_variables], model.trainable_variables)

    for _ in range(2):
        step()
    return model, optimizer, step


def test_a_checkpoint_restores_weights_optimizer_dropout_state_and_position(tmp_path, trained):
    model, optimizer, step = trained
    saved = TrainingCheckpoints(str(tmp_path), model, optimizer, "sha", keep=2)
    path = saved.save(Position(step=3, epoch=1, batch=2))
    expected = state(model, optimizer)
    seeds = [v.numpy() for v in model.non_trainable_variables]
    assert seeds and any(s.any() for s in seeds)  # dropout layers keep a random state
    step()  # move everything on after the save

    fresh_model, fresh_optimizer = build(seed=2)
    restored = TrainingCheckpoints(str(tmp_path), fresh_model, fresh_optimizer, "sha", keep=2)
    assert restored.restore_latest(log=print) == path
    assert restored.position == Position(step=3, epoch=1, batch=2)
    for got, want in zip(state(fresh_model, fresh_optimizer), expected):
        np.testing.assert_array_equal(got, want)
    names = [name for name, _ in tf.train.list_variables(path)]
    assert sum(name.startswith("dropout_seeds/") for name in names) == len(seeds)


def test_the_last_k_checkpoints_are_kept(tmp_path, trained):
    checkpoints = TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=2)
    for step in (5, 10, 15):
        checkpoints.save(Position(step=step))
    assert [os.path.basename(p) for p in checkpoints.manager.checkpoints] == ["ckpt-10", "ckpt-15"]
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".index")) == ["ckpt-10.index", "ckpt-15.index"]


def saved_values(prefix):
    return {name: tf.train.load_variable(prefix, name) for name, _ in tf.train.list_variables(prefix)}


def test_a_traced_write_saves_what_an_eager_write_saves_at_every_save_and_after_an_attach(tmp_path, trained):
    """Checkpoint writes through one traced function: each save holds the values of that moment, in the files an
    eager tf.train.Checkpoint.write makes (one data file), and a part attached later is saved too."""
    model, optimizer, step = trained
    checkpoints = TrainingCheckpoints(str(tmp_path / "new" / "folder"), model, optimizer, "sha", keep=3)

    def eager_write(name):  # the same objects, written by tf.train.Checkpoint's own, eager write
        return tf.train.Checkpoint.write(checkpoints.checkpoint, str(tmp_path / "eager" / name))

    for number in (1, 2):
        path = checkpoints.save(Position(step=number))
        eager = eager_write(f"e-{number}")
        assert sorted(os.listdir(os.path.dirname(path))) == ["checkpoint"] + [
            f"ckpt-{n}.{suffix}" for n in range(1, number + 1) for suffix in ("data-00000-of-00001", "index")]
        traced_values, eager_values = saved_values(path), saved_values(eager)
        assert traced_values.keys() == eager_values.keys()
        for name, value in eager_values.items():
            np.testing.assert_array_equal(traced_values[name], value, err_msg=name)
        step()  # the next save must see the moved values
    assert not np.array_equal(saved_values(path)["step/.ATTRIBUTES/VARIABLE_VALUE"], 1)
    checkpoints.attach("extra", tf.Variable(7.5, name="extra"))
    path = checkpoints.save(Position(step=3))
    assert saved_values(path)["extra/.ATTRIBUTES/VARIABLE_VALUE"] == 7.5
    assert saved_values(path).keys() == saved_values(eager_write("e-3")).keys()


def truncate(prefix):
    data = prefix + ".data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def scramble(prefix):
    data = prefix + ".data-00000-of-00001"
    with open(data, "r+b") as f:
        raw = bytearray(f.read())
        raw[len(raw) // 3: len(raw) // 3 + 64] = bytes(64)
        f.seek(0)
        f.write(raw)


def lose_index(prefix):
    os.remove(prefix + ".index")


@pytest.mark.parametrize("damage", [truncate, scramble, lose_index])
def test_a_damaged_latest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, trained, damage):
    checkpoints = TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=3)
    paths = [checkpoints.save(Position(step=s, epoch=0, batch=s)) for s in (1, 2, 3)]
    damage(paths[-1])
    lines = []
    fresh = TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=3)
    assert fresh.restore_latest(log=lines.append) == paths[1]
    assert fresh.position == Position(step=2, epoch=0, batch=2)
    assert len(lines) == 1 and paths[2] in lines[0] and "unreadable" in lines[0]


def test_no_readable_checkpoint_is_a_clear_error(tmp_path, trained):
    checkpoints = TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=3)
    paths = [checkpoints.save(Position(step=s)) for s in (1, 2)]
    for path in paths:
        truncate(path)
    with pytest.raises(UserError, match="no readable checkpoint") as error:
        TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=3).restore_latest(log=lambda line: None)
    assert all(path in str(error.value) for path in paths)


def test_an_empty_directory_has_nothing_to_restore(tmp_path, trained):
    assert TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=3).restore_latest(log=print) is None


def test_the_restore_check_can_refuse_a_checkpoint(tmp_path, trained):
    checkpoints = TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=3)
    checkpoints.save(Position(step=1))

    def refuse(path):
        raise UserError(f"{path}: other tokenizer")

    with pytest.raises(UserError, match="other tokenizer"):
        checkpoints.restore_latest(log=print, check=refuse)


def test_sigterm_and_sigint_become_a_stop_request_then_the_old_handlers_return():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopRequest() as stop:
        assert stop.signum is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM  # still alive: the loop decides when to stop
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    with pytest.raises(KeyboardInterrupt):
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.signum == signal.SIGINT
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C stops at once
    assert Interrupted(signal.SIGTERM, "ckpt-7").exit_code == 143
    assert Interrupted(signal.SIGINT, "ckpt-7").exit_code == 130


def test_a_directory_of_another_architecture_is_refused_naming_the_keys(tmp_path):
    model_dir = str(tmp_path)
    hp = load_hparams("toy")
    hp.save(os.path.join(model_dir, "hparams.yaml"))
    tf.train.Checkpoint(v=tf.Variable(1.0)).save(os.path.join(model_dir, "ckpt"))
    splits = corpus.corpus_splits("toy")
    with pytest.raises(UserError) as error:
        train(hp.replace(num_blocks=1, d_ff=48), splits, model_dir, log=lambda line: None)
    message = str(error.value)
    assert "num_blocks: 2" in message and "d_ff: 64" in message and "num_units" not in message


def test_a_full_disk_stops_with_one_line_keeps_the_last_checkpoint_and_leaves_no_temporary_files(tmp_path, trained):
    """Issue 24: a save on a full disk used to end in a raw ResourceExhaustedError and leave ckpt-N_temp/."""
    with small_disk(tmp_path / "disk", 2048) as disk:
        checkpoints = TrainingCheckpoints(disk, *trained[:2], "sha", keep=3)
        first = checkpoints.save(Position(step=1))
        fill(disk, 4 << 10)
        with pytest.raises(UserError) as raised:
            checkpoints.save(Position(step=2))
        message = str(raised.value)
        assert message.startswith(f"checkpoint {disk}: cannot write it (No space left on device; ") and \
            f"free there); the latest checkpoint, {first}, is intact; free some space and run the same command " \
            f"again to resume" in message and "\n" not in message
        assert sorted(os.listdir(disk)) == ["ballast", "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
        os.remove(os.path.join(disk, "ballast"))
        fresh = TrainingCheckpoints(disk, *build(seed=3), "sha", keep=3)
        assert fresh.restore_latest(log=print) == first


def test_a_resume_prints_no_warning_about_the_architecture_record(tmp_path, trained, caplog):
    """Issue 24: every resume printed "Value in checkpoint could not be found ... (root).architecture"."""
    TrainingCheckpoints(str(tmp_path), *trained[:2], "sha", keep=2, architecture="{}").save(Position(step=1))
    fresh = TrainingCheckpoints(str(tmp_path), *build(seed=3), "sha", keep=2, architecture="{}")
    assert fresh.restore_latest(log=print) is not None
    del fresh
    gc.collect()
    assert not [r for r in caplog.records if "could not be found" in r.getMessage()]
