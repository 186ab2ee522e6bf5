"""Issue 14: never lose a user's work. One writer per model directory, a resume that does not
depend on the state file, no NaN model kept or exported, every check before the first step,
one loader for every reader, one line for every interrupt."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.toy_model import train_here
from tf_transformer import locks
from tf_transformer.cli import export as export_cli
from tf_transformer.cli import train as train_cli
from tf_transformer.cli import translate as translate_cli
from tf_transformer.data import corpus
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.files import read_text_lines
from tf_transformer.hparams import HParamsError, load_hparams
from tf_transformer.infer import export
from tf_transformer.infer.load import load_for_inference
from tf_transformer.train import loop
from tf_transformer.train.checkpoints import Interrupted, StopRequest
from tf_transformer.train.run import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY_ARGS = ["--preset", "toy", "--data", "toy", "--no-progress", "--samples", "0", "--no-export",
            "--set", "eval_every_epochs=0"]
# Holds DIRECTORY's lock until a line arrives on standard input, then creates DIRECTORY/CREATE if given.
HOLDER = textwrap.dedent("""
    import os, sys
    from tf_transformer.locks import DirectoryLock
    with DirectoryLock(sys.argv[1], "dir"):
        print("held", flush=True)
        sys.stdin.readline()
        if len(sys.argv) > 2:
            os.makedirs(os.path.join(sys.argv[1], sys.argv[2]))
""")


def env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}


def hold_lock(directory, *create):
    """A process holding ``directory``'s lock (it has taken it when this returns)."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, directory, *create], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env())
    assert process.stdout.readline().strip() == "held"
    return process


def release(process):
    process.stdin.write("\n")
    process.stdin.flush()
    assert process.wait(timeout=30) == 0


def one_line_error(capsys, code):
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (code, err)
    return err


def toy_train(model_dir, *settings, **kwargs):
    hp = load_hparams("toy", overrides=["eval_every_epochs=0", *settings])
    lines = []
    result = train(hp, corpus.corpus_splits("toy"), model_dir, log=lines.append, samples=0,
                         **{"export": False, **kwargs})
    return result, lines


# ---- 1. one writer per model directory ---------------------------------------------

@pytest.mark.slow  # a train.py process
def test_a_second_trainer_is_refused_and_a_sigkilled_holder_leaves_no_stale_lock(tmp_path, capsys):
    """A train.py process holds the model directory; train.py's main in this process (a TensorFlow import fewer
    than a second process, the lock's file the same) is refused, then resumes there once the holder is killed."""
    model_dir = str(tmp_path / "run")
    argv = [*TOY_ARGS, "--model-dir", model_dir]
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *argv, "--set", "num_epochs=100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    deadline = time.monotonic() + 240
    while not os.path.exists(os.path.join(model_dir, "ckpt-2.index")):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = train_here(capsys, *argv)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --model-dir {model_dir}: "), second.stderr
    assert f"in use by process {first.pid}" in errors[0]
    first.kill()  # SIGKILL while holding the lock
    first.communicate()
    third = train_here(capsys, *argv, "--set", "num_epochs=1")
    assert third.returncode == 0, third.stderr
    assert f"resumed from {model_dir}/ckpt-" in third.stdout
    assert not os.path.exists(os.path.join(model_dir, locks.LOCK_FILE))  # released and removed at the end


def test_a_lock_is_reentrant_in_one_process_and_removed_when_released(tmp_path):
    directory = str(tmp_path / "new")
    with locks.DirectoryLock(directory, "--model-dir", remove_if_unused=True):
        with open(os.path.join(directory, locks.LOCK_FILE)) as f:
            assert f.read().strip() == str(os.getpid())
        with locks.DirectoryLock(directory, "--model-dir"):
            pass
        assert os.path.exists(os.path.join(directory, locks.LOCK_FILE))
    assert not os.path.exists(directory)  # created for the lock, still empty: removed
    os.makedirs(directory)
    with locks.DirectoryLock(directory, "--model-dir"):
        pass
    assert os.listdir(directory) == []  # it existed before: kept


def test_a_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="--model-dir .*file: is a file"):
        with locks.DirectoryLock(str(tmp_path / "file"), "--model-dir"):
            pass


def test_export_cli_refuses_a_model_dir_in_use_naming_the_process(toy_dir, tmp_path, capsys):
    holder = hold_lock(toy_dir)
    try:
        err = one_line_error(capsys, export_cli.main(["--model-dir", toy_dir, "--export-dir", str(tmp_path)]))
        assert toy_dir in err and f"process {holder.pid}" in err
    finally:
        release(holder)
    assert os.listdir(tmp_path) == []


@pytest.fixture
def fake_save(monkeypatch):
    """A quick stand-in for tf.saved_model.save."""

    def save(obj, path, signatures=None):
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(b"stand-in")

    monkeypatch.setattr(tf.saved_model, "save", save)


def test_exports_to_one_folder_take_turns_and_stale_temporary_folders_go(toy_loaded, tmp_path, fake_save):
    export_dir = str(tmp_path)
    os.makedirs(tmp_path / ".tmp-export-killed")  # left by a killed export
    other = hold_lock(export_dir, "1")  # another exporter, about to write version 1
    waited = []

    def on_wait(line):
        waited.append(line)
        release(other)

    path = export.export_saved_model(toy_loaded, export_dir, log=on_wait)
    assert path == os.path.join(export_dir, "2")
    assert len(waited) == 1 and f"waiting for process {other.pid}" in waited[0]
    assert sorted(os.listdir(export_dir)) == ["1", "2"]


# ---- 2. resume without the state file ------------------------------------------------

@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory):
    """A toy model directory after 3 one-step epochs (ckpt-1 to ckpt-3), copied afresh by each test."""
    model_dir = str(tmp_path_factory.mktemp("three") / "run")
    toy_train(model_dir, "num_epochs=3")
    return model_dir


@pytest.fixture
def trained_dir(three_epochs, tmp_path):
    copy = str(tmp_path / "run")
    shutil.copytree(three_epochs, copy)
    return copy


@pytest.mark.parametrize("damage", ["delete", "garbage"])
def test_a_missing_or_damaged_state_file_resumes_from_the_newest_checkpoint_file(trained_dir, damage):
    state = os.path.join(trained_dir, "checkpoint")
    if damage == "delete":
        os.remove(state)
    else:
        with open(state, "wb") as f:
            f.write(b"\xff\x00 not a state file {")
    result, lines = toy_train(trained_dir, "num_epochs=5")
    assert any("does not list ckpt-1, ckpt-2, ckpt-3" in line for line in lines), lines
    assert any(line.startswith(f"resumed from {trained_dir}/ckpt-3 (step 3,") for line in lines), lines
    assert result.step == 5
    # The state file was written anew and rotation went on: ckpt-1 and ckpt-2 rotated out.
    assert tf.train.latest_checkpoint(trained_dir) == os.path.join(trained_dir, "ckpt-5")
    indexes = sorted(f for f in os.listdir(trained_dir) if f.endswith(".index"))
    assert indexes[-2:] == ["ckpt-4.index", "ckpt-5.index"] and "ckpt-1.index" not in indexes, indexes


def test_no_readable_checkpoint_never_starts_over_unless_restart_is_asked(trained_dir):
    for n in (1, 2, 3):
        with open(os.path.join(trained_dir, f"ckpt-{n}.data-00000-of-00001"), "r+b") as f:
            f.truncate(10)
    with pytest.raises(UserError, match="no readable checkpoint.*--restart"):
        toy_train(trained_dir, "num_epochs=5")
    result, lines = toy_train(trained_dir, "num_epochs=2", restart=True)
    assert result.step == 2
    aside = [name for name in os.listdir(trained_dir) if name.startswith("previous-")]
    assert len(aside) == 1 and any(aside[0] in line for line in lines)
    assert os.path.getsize(os.path.join(trained_dir, aside[0], "ckpt-3.data-00000-of-00001")) == 10  # kept


# ---- 5. one loader for every reader ---------------------------------------------------

def test_other_shapes_asked_without_hparams_yaml_name_the_key_not_unreadable(trained_dir):
    os.remove(os.path.join(trained_dir, "hparams.yaml"))
    with pytest.raises(UserError) as error:
        toy_train(trained_dir, "num_epochs=5", "num_units=64")
    message = str(error.value)
    assert f"{trained_dir}/ckpt-3 has num_units 32, this run's hyper-parameters say num_units 64" in message
    assert "unreadable" not in message


def test_readers_name_an_edited_hparams_yaml_and_fall_back_past_a_truncated_checkpoint(trained_dir, capsys):
    newest = os.path.join(trained_dir, "ckpt-3.data-00000-of-00001")
    with open(newest, "r+b") as f:
        f.truncate(100)
    lines = []
    hp, *_, model = load_for_inference(trained_dir, log=lines.append)
    assert len(lines) == 1 and "ckpt-3 is unreadable" in lines[0]
    np.testing.assert_array_equal(model.logits_layer.bias.numpy(),
                                  tf.train.load_variable(os.path.join(trained_dir, "ckpt-2"),
                                                         "model/logits_layer/bias/.ATTRIBUTES/VARIABLE_VALUE"))
    hparams = os.path.join(trained_dir, "hparams.yaml")
    hp.replace(num_units=64, d_ff=128).save(hparams)
    assert translate_cli.main(["--model-dir", trained_dir, "ich"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("warning: checkpoint ") and err.count("\nerror: ") == 1 and err.count("\n") == 2, err
    assert f"ckpt-2 has num_units 32 and d_ff 64, {hparams} says num_units 64 and d_ff 128" in err
    assert "Traceback" not in err


# ---- 3. non-finite training stops, clearly ----------------------------------------------

def test_a_diverging_run_stops_with_one_line_and_keeps_only_finite_weights(tmp_path):
    model_dir = str(tmp_path / "run")
    with pytest.raises(loop.Diverged) as error:
        toy_train(model_dir, "learning_rate=1e30", "num_epochs=30", export=True)
    message = str(error.value)
    assert message.startswith("training diverged at step ") and "\n" not in message
    assert "last finite loss" in message and "learning_rate (now 1e+30)" in message
    checkpoints = [name[: -len(".index")] for name in os.listdir(model_dir) if name.endswith(".index")]
    assert checkpoints and f"kept {model_dir}/{max(checkpoints)}," in message
    for name in checkpoints:
        for variable, _ in tf.train.list_variables(os.path.join(model_dir, name)):
            if variable.startswith("model/"):
                assert np.isfinite(tf.train.load_variable(os.path.join(model_dir, name), variable)).all()
    assert not os.path.exists(os.path.join(model_dir, "best")) and not os.path.exists(os.path.join(model_dir, "export"))


@pytest.mark.parametrize("setting, fragment", [
    ("learning_rate=.inf", "learning_rate=inf must be a finite number"),
    ("clip_norm=.nan", "clip_norm=nan must be a finite number"),
    ("train_minutes=.nan", "train_minutes=nan must be a finite number"),
    ("length_penalty=.nan", "length_penalty=nan must be a finite number"),
    ("beam_size=65", "beam_size=65 must be at most 64"),
    ("seed=-1", "seed=-1 must be between 0 and 4294967295"),
    ("seed=4294967296", "seed=4294967296 must be between 0"),
])
def test_hyper_parameters_that_would_fail_later_are_refused_at_once(setting, fragment):
    with pytest.raises(HParamsError, match=fragment.replace(".", r"\.")):
        load_hparams("toy", overrides=[setting])


@pytest.mark.parametrize("text", ["0\n", "false\n", "'beam_size'\n"])
def test_a_config_file_that_is_a_bare_scalar_is_refused(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(HParamsError, match=f"{path}: expected a mapping"):
        load_hparams("toy", config=str(path))


# ---- 4. every check before the first step ---------------------------------------------

def write_corpus(directory, test_source=b"ich\nein\n", test_target=b"i\na\n"):
    os.makedirs(directory)
    shutil.copy(os.path.join(corpus.EMBEDDED["toy"], "train.de"), directory)
    shutil.copy(os.path.join(corpus.EMBEDDED["toy"], "train.en"), directory)
    with open(os.path.join(directory, "test.de"), "wb") as f:
        f.write(test_source)
    with open(os.path.join(directory, "test.en"), "wb") as f:
        f.write(test_target)
    return directory


@pytest.mark.parametrize("case", ["test split missing a line", "test split not UTF-8", "export dir under a file",
                                  "model dir is a file", "negative samples"])
def test_mistakes_found_before_the_first_step_get_one_line_and_nothing_is_trained(tmp_path, capsys, case):
    model_dir = str(tmp_path / "run")
    data = str(tmp_path / "data")
    args = ["--preset", "toy", "--no-progress", "--model-dir", model_dir, "--data", data]
    fragment = {"test split missing a line": f"{data}/test.de has 2 sentences but {data}/test.en has 1",
                "test split not UTF-8": f"{data}/test.en:2: not valid UTF-8",
                "export dir under a file": f"--export-dir {tmp_path}/file/export: {tmp_path}/file is a file",
                "model dir is a file": f"--model-dir {tmp_path}/file: is a file",
                "negative samples": "--samples -1: must be 0 or more"}[case]
    write_corpus(data, test_target={"test split missing a line": b"i\n", "test split not UTF-8": b"i\n\xff\n"}
                 .get(case, b"i\na\n"))
    (tmp_path / "file").write_text("")
    args += {"export dir under a file": ["--export-dir", str(tmp_path / "file" / "export")],
             "model dir is a file": ["--model-dir", str(tmp_path / "file")],
             "negative samples": ["--samples", "-1"]}.get(case, [])
    err = one_line_error(capsys, train_cli.main(args))
    assert fragment in err, err
    assert not os.path.exists(model_dir) or not any(f.startswith("ckpt-") for f in os.listdir(model_dir))


def test_a_finished_run_that_cannot_export_says_how_to_export_later(trained_dir, monkeypatch, capsys, fake_save):
    def fail(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as patch:
        patch.setattr(export, "_save", fail)
        with pytest.raises(UserError) as error:
            toy_train(trained_dir, "num_epochs=3", export=True)
    message = str(error.value)
    later = f"python -m tf_transformer.cli.export --model-dir {trained_dir} --export-dir {trained_dir}/export"
    assert message.startswith("training is complete but the export") and later in message
    assert export_cli.main(["--model-dir", trained_dir]) == 0  # finishing the job later
    assert os.listdir(os.path.join(trained_dir, "export")) == ["1"]


def test_cr_only_line_ends_are_line_ends(tmp_path):
    path = tmp_path / "mac.txt"
    path.write_bytes(b"eins\rzwei\rdrei\r")
    assert read_text_lines(str(path)) == ["eins", "zwei", "drei"]
    path.write_bytes(b"ein\rs\nzwei\n")  # a lone CR in a \n-ended file stays in its line
    assert read_text_lines(str(path)) == ["ein\rs", "zwei"]


def test_translate_refuses_an_output_directory_and_non_finite_flags_before_loading(tmp_path, capsys):
    for flags, fragment in ((["--output", str(tmp_path)], "is a directory"),
                            (["--length-penalty", "inf"], "--length-penalty inf: must be a finite number"),
                            (["--length-penalty", "nan"], "--length-penalty nan"),
                            (["--max-length-factor", "-1"], "--max-length-factor -1.0: must be 0 (none) or more"),
                            (["--max-length-factor", "inf"], "--max-length-factor inf: must be a finite number"),
                            (["--xla", "--trace"], "--trace shows the reference decoder's steps")):
        err = one_line_error(capsys, translate_cli.main(["--model-dir", str(tmp_path / "none"), *flags, "ich"]))
        assert fragment in err


# ---- 6. interrupts at any phase ----------------------------------------------------------

def test_after_training_a_signal_stops_at_once_with_one_line_and_the_usual_exit_code():
    with StopRequest() as stop:
        stop.at_once("export", "run/ckpt-9")
        with pytest.raises(Interrupted) as error:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
    assert error.value.exit_code == 143
    assert "during the export" in str(error.value) and "run/ckpt-9" in str(error.value)
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # while training: remembered
        with pytest.raises(Interrupted) as error:
            stop.at_once("final evaluation", "run/ckpt-9")
    assert error.value.exit_code == 130


def test_ctrl_c_reaching_an_entry_point_is_one_line_and_exit_code_130(capsys):
    @report_user_errors
    def main(argv=None):
        raise KeyboardInterrupt

    assert main([]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted: ") and err.count("\n") == 1
