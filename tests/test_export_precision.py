"""The bfloat16 export (export_saved_model(precision="bfloat16"), ``export --precision bfloat16``) and
translate_xla's bucketed loop in the export."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.toy_model import TOY, toy_export
from tf_transformer.cli import export as export_cli
from tf_transformer.errors import UserError
from tf_transformer.infer import export


def served(saved, signature, sentences, beam_size):
    outputs = saved.signatures[signature](inputs=tf.constant(sentences), beam_size=tf.constant(beam_size))
    return [t.decode() for t in outputs["translations"].numpy()], outputs["scores"].numpy()


@pytest.fixture(scope="module")
def exports(toy_loaded, tmp_path_factory):
    # translate_xla of float32 only: the bfloat16 model runs the same compiled loop, and each XLA export costs
    # tens of seconds of tracing. The float32 export with translate_xla is the session's toy export (the same
    # model, exported by export_model_dir with xla=True: test_export.py, test_serving.py and test_c_loader.py
    # use it too), made once per test process.
    assert export.PRECISIONS == ("float32", "bfloat16")
    bfloat16 = export.export_saved_model(toy_loaded, str(tmp_path_factory.mktemp("precision") / "bfloat16"),
                                         precision="bfloat16")
    return {"float32": tf.saved_model.load(toy_export(tmp_path_factory)), "bfloat16": tf.saved_model.load(bfloat16)}


@pytest.mark.slow  # two exports
def test_bfloat16_export_translates_as_float32_with_bfloat16_weights(exports, toy_loaded):
    sentences = list(TOY)
    bf16, f32 = exports["bfloat16"], exports["float32"]
    assert {v.dtype for v in bf16.model_variables} == {tf.bfloat16}
    assert {v.dtype for v in f32.model_variables} == {tf.float32}
    assert toy_loaded.model.compute_dtype == "float32"  # the loaded model is left as it was
    assert keras.mixed_precision.global_policy().name == "float32"
    assert "translate_xla" not in bf16.signatures
    for beam_size in (1, toy_loaded.hp.beam_size):
        translations, scores = served(bf16, "translate", sentences, beam_size)
        expected, expected_scores = served(f32, "translate", sentences, beam_size)
        assert translations == expected == list(TOY.values())
        np.testing.assert_allclose(scores, expected_scores, atol=0.05)
    outputs = bf16.signatures["serving_default"](inputs=tf.constant(sentences))
    assert [t.decode() for t in outputs["translations"].numpy()] == list(TOY.values())


@pytest.mark.slow  # two exports
def test_translate_xla_with_buckets_equals_translate(exports, toy_loaded):
    sentences = [*TOY, "ich", "ich mochte ein bier ein cola ein orangensaft", "cola"]
    f32 = exports["float32"]
    for beam_size in (1, toy_loaded.hp.beam_size):
        translations, scores = served(f32, "translate", sentences, beam_size)
        compiled, compiled_scores = served(f32, "translate_xla", sentences, beam_size)
        assert compiled == translations
        np.testing.assert_allclose(compiled_scores, scores, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("precision", ["int8", "float16", "bf16", ""])
def test_a_bad_precision_names_the_value_and_the_valid_ones(toy_loaded, tmp_path, precision):
    with pytest.raises(UserError, match=rf"--precision {precision!r}: must be one of float32, bfloat16"):
        export.export_saved_model(toy_loaded, str(tmp_path), precision=precision)
    with pytest.raises(UserError, match=rf"--precision {precision!r}: must be one of float32, bfloat16"):
        export.export_model_dir(str(tmp_path / "missing"), str(tmp_path / "out"), precision=precision)
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_command_line_offers_the_precisions(capsys):
    assert export_cli.parse_args(["--model-dir", "m", "--precision", "bfloat16"]).precision == "bfloat16"
    with pytest.raises(SystemExit):
        export_cli.parse_args(["--model-dir", "m", "--precision", "int8"])
    assert "invalid choice: 'int8' (choose from" in capsys.readouterr().err
    with pytest.raises(UserError, match="--precision: not an option of --format ctranslate2"):
        export_cli.parse_args(["--model-dir", "m", "--format", "ctranslate2", "--precision", "bfloat16"])


def test_a_bfloat16_exports_compiled_loops_run_its_float32_weights(toy_loaded):
    """XLA:CPU computes bfloat16 products in float32 and would convert every weight at every call: the compiled
    loops of a bfloat16 export's translate_xla (one sentence, small batches) run the float32 model, whose
    variables the export tracks beside the bfloat16 ones; its growing loops run the bfloat16 model."""
    bfloat16 = export.reduced_precision(toy_loaded.model, "bfloat16")
    translator = export.Translator(*toy_loaded.tokenizers, bfloat16, beam_size=4, xla=True,
                                   xla_model=toy_loaded.model)
    assert {v.dtype for v in translator.model_variables} == {tf.bfloat16}
    assert {v.dtype for v in translator.xla_model_variables} == {tf.float32}
    float32 = export.Translator(*toy_loaded.tokenizers, toy_loaded.model, beam_size=4)
    sentence, greedy = tf.constant(list(TOY)[:1]), tf.constant(1)
    compiled = translator.translate_xla(sentence, greedy)
    growing = translator.translate(sentence, greedy)
    expected = float32.translate(sentence, greedy)
    assert compiled["translations"].numpy().tolist() == expected["translations"].numpy().tolist()
    np.testing.assert_allclose(compiled["scores"].numpy(), expected["scores"].numpy(), rtol=1e-5)
    # bfloat16's products move the score ten times that tolerance and more: the compiled loop did not run them
    assert np.abs(growing["scores"].numpy() / expected["scores"].numpy() - 1).max() > 1e-4
