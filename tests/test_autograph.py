"""The package's ``tf.function``s trace its Python as written: none goes through AutoGraph, whose
conversion of the package's ~65 functions cost 6-8 s at the start of every train.py or translate.py
process on a 2-core CPU (its loops and branches are ``tf.while_loop``, ``tf.cond`` and
``tf.switch_case`` already)."""

import tensorflow as tf
from tensorflow.python.autograph.impl import api

from helpers import built_model_and_optimizer, padded_ids
from tf_transformer.hparams import load_hparams
from tf_transformer.infer.decode import compiled_decoder, generate
from tf_transformer.infer.score import _score_batch
from tf_transformer.nn.model import shift_right
from tf_transformer.train.checkpoints import Position, TrainingCheckpoints
from tf_transformer.train.loop import finite_check
from tf_transformer.train.step import make_train_step

VOCAB = 19


def converted_package_functions(monkeypatch):
    """The list that each call AutoGraph is asked to convert a function of ``tf_transformer`` appends its name to
    (``tf.function(autograph=True)`` hands its Python function to ``api.converted_call`` at every trace)."""
    calls, original = [], api.converted_call

    def recording(function, *args, **kwargs):
        if getattr(function, "__module__", "").startswith("tf_transformer"):
            calls.append(function.__qualname__)
        return original(function, *args, **kwargs)

    monkeypatch.setattr(api, "converted_call", recording)
    return calls


def test_training_decoding_scoring_and_saving_trace_without_autograph(monkeypatch, tmp_path):
    converted = converted_package_functions(monkeypatch)
    hp = load_hparams("toy", overrides=["num_blocks=1", "num_units=16", "num_heads=2", "d_ff=32", "jit_compile=true"])
    model, optimizer = built_model_and_optimizer(hp, VOCAB, seed=1)
    x = tf.constant(padded_ids(1, [4, 2, 3], 4, VOCAB))
    y = tf.constant(padded_ids(2, [3, 3, 1], 3, VOCAB))
    make_train_step(model, optimizer, hp)(x, y)
    for beam_size in (1, 2):
        generate(model, x, beam_size=beam_size, max_length=5)
        compiled_decoder(model, beam_size=beam_size, nbest=1, max_length=5)(x, tf.fill([3], 5), 0.6, 0.0)
    _score_batch(model, x, y, 0.6)
    finite_check(model.trainable_variables)()
    TrainingCheckpoints(str(tmp_path), model, optimizer, "sha", keep=1).save(Position(step=1))
    assert converted == []
    tf.function(shift_right)(y)  # AutoGraph on, as tf.function has it by default: the hook sees it
    assert converted == ["shift_right"]
