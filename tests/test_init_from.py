"""Fine-tuning (``train.py --init-from DIR``): a new run from DIR's kept weights and tokenizer, with a fresh
optimizer and schedule; another architecture refused naming the keys; the tokenizer's coverage reported."""

import filecmp
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.test_average import save, tiny_model_dir
from tf_transformer.cli import train as train_cli
from tf_transformer.data import corpus
from tf_transformer.model_dir import checkpoint_files
from tf_transformer.train.run import train


@pytest.fixture
def source_dir(tmp_path):
    """A tiny word-level model directory with one checkpoint (step 10) of seeded weights."""
    path = tmp_path / "general"
    hp, tokenizers, model = tiny_model_dir(path, "lr_schedule=constant", "learning_rate=1e-9")
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype(np.float32))
    save(str(path), model, tokenizers, 10)
    return str(path), hp, [v.numpy() for v in model.trainable_variables]


def test_a_new_run_starts_from_the_kept_weights_and_tokenizer_with_a_fresh_optimizer(source_dir, tmp_path):
    path, hp, weights = source_dir
    corpus_file = tmp_path / "domain.tsv"  # 2 of its 8 source words and 1 of its 8 target words are new
    corpus_file.write_text("ich mochte ein bier\ti want a beer\nzwei neue ein cola\ti want a tea\n")
    new, lines = tmp_path / "domain", []
    result = train(hp.replace(num_epochs=1, eval_every_epochs=0), {"train": corpus.Split(str(corpus_file))},
                   str(new), log=lines.append, samples=0, export=False, init_from=path)
    log = "\n".join(lines)
    assert f"initialised from {path}: its newest checkpoint" in log
    assert "25.00% of the source and 12.50% of the target tokens of the training pairs are <UNK>" in log
    for name in ("source.vocab.tsv", "target.vocab.tsv"):
        assert filecmp.cmp(os.path.join(path, name), new / name, shallow=False)
    assert result.step == 1  # one batch of 2: the step counter starts from 0, not from the source's 10
    checkpoint = checkpoint_files.find_checkpoints(str(new))[-1]
    assert checkpoint.endswith("ckpt-1") and tf.train.load_variable(
        checkpoint, "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 1
    # learning_rate 1e-9: the run's weights are still the source's
    for got, want in zip(result.model.trainable_variables, weights):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--set", "num_units=16", "--set", "d_ff=16"], "fine-tuning keeps its architecture and tokenizer, but num_units: "
                                                    "8 in {src}/hparams.yaml, 16 now; d_ff: 8 in"),
    (["--preset", "toy"], "--preset with --init-from: the hyper-parameters are {src}'s hparams.yaml"),
    (["--restart"], "--restart with --init-from"),
    (["--strategy", "multi_worker"], "--init-from with --strategy multi_worker: not supported"),
    (["--init-from", "{tmp}"], "--init-from {tmp}: not a model directory that train.py wrote"),
])
def test_wrong_fine_tuning_arguments_are_refused_in_one_line(source_dir, tmp_path, argv, message, capsys):
    path = source_dir[0]
    argv = [a.format(src=path, tmp=tmp_path) for a in argv]
    code = train_cli.main(["--init-from", path, "--model-dir", str(tmp_path / "new"), "--tsv", str(tmp_path / "x"),
                           "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert message.format(src=path, tmp=tmp_path) in err


def test_fine_tuning_needs_a_new_model_directory(source_dir, capsys):
    assert train_cli.main(["--init-from", source_dir[0], "--tsv", "x"]) == 2
    assert "--init-from needs --model-dir NEW" in capsys.readouterr().err
