"""The SavedModel export: round trip, op audit, a fresh process, saved_model_cli, versions."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from helpers import fill, small_disk
from tests.toy_model import TOY, toy_export
from tf_transformer.cli import export as export_cli
from tf_transformer.data.tokenizer import WordTokenizer
from tf_transformer.data.vocab import WordVocab
from tf_transformer.errors import UserError
from tf_transformer.hparams import load_hparams
from tf_transformer.infer import export
from tf_transformer.infer.load import LoadedModel
from tf_transformer.infer.score import score_pairs
from tf_transformer.infer.translate import translate, translate_nbest
from tf_transformer.infer.warmup import WARMUP_SENTENCE, read_warmup_requests
from tf_transformer.model_dir.checkpoint_files import build_model

SENTENCES = [*TOY, "ich mochte ein", "bier cola ein mochte ich", "ich ich ich ich"]
FORBIDDEN_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction"}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """The export's version folder."""
    return toy_export(tmp_path_factory)


@pytest.fixture(scope="module")
def saved(path):
    return tf.saved_model.load(path)


def read_saved_model(path):
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model


def served(saved, signature="serving_default", **inputs):
    outputs = saved.signatures[signature](**inputs)
    return [t.decode("utf-8") for t in outputs["translations"].numpy()], outputs["scores"].numpy()


def local(toy_loaded, sentences, beam_size, length_penalty):
    _, source_tokenizer, target_tokenizer, model = toy_loaded
    results = translate_nbest(sentences, source_tokenizer, target_tokenizer, model, batch_size=4,
                              beam_size=beam_size, length_penalty=length_penalty)
    return [r[0][0] for r in results], np.array([r[0][1] for r in results], np.float32)


@pytest.mark.slow  # trains and exports the shared model when it runs first
def test_round_trip_export_and_python_model_give_the_same_translations(saved, toy_loaded):
    hp = toy_loaded[0]
    translations, scores = served(saved, inputs=tf.constant(SENTENCES))
    expected, expected_scores = local(toy_loaded, SENTENCES, hp.beam_size, hp.length_penalty)
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)
    assert translations[:3] == list(TOY.values())  # the model did learn the corpus
    greedy, greedy_scores = served(saved, "translate", inputs=tf.constant(SENTENCES), beam_size=tf.constant(1))
    expected, expected_scores = local(toy_loaded, SENTENCES, 1, hp.length_penalty)
    assert greedy == expected
    np.testing.assert_allclose(greedy_scores, expected_scores, rtol=1e-4, atol=1e-4)
    # The tf.function attribute honours the default beam size too.
    default = saved.translate(tf.constant(SENTENCES))
    assert [t.decode() for t in default["translations"].numpy()] == translations
    # The XLA-compiled signature: the default beam's translations and greedy's, a batch of one, no input
    # at all, and a beam size it was not compiled for.
    beam = tf.constant(hp.beam_size)
    compiled, compiled_scores = served(saved, "translate_xla", inputs=tf.constant(SENTENCES), beam_size=beam)
    assert compiled == translations
    np.testing.assert_allclose(compiled_scores, scores, rtol=1e-4, atol=1e-4)
    assert served(saved, "translate_xla", inputs=tf.constant(SENTENCES), beam_size=tf.constant(1))[0] == greedy
    assert served(saved, "translate_xla", inputs=tf.constant(SENTENCES[:1]), beam_size=beam)[0] == translations[:1]
    assert served(saved, "translate_xla", inputs=tf.constant([], tf.string), beam_size=beam)[0] == []
    with pytest.raises(tf.errors.InvalidArgumentError, match="beam_size of translate_xla must be 1 or 4"):
        served(saved, "translate_xla", inputs=tf.constant(SENTENCES), beam_size=tf.constant(2))


@pytest.mark.slow  # an export of its own
def test_round_trip_of_a_word_vocabulary_model_passed_as_loaded(tmp_path):
    """The tuple that load_for_inference returns (as train.py passes it), word tokenizers, untrained."""
    hp = load_hparams("toy", overrides=["num_units=16", "d_ff=32", "num_blocks=1", "beam_size=2"])
    sources, targets = [s for s in TOY], [t for t in TOY.values()]
    tokenizers = WordTokenizer(WordVocab.build(sources)), WordTokenizer(WordVocab.build(targets))
    model = build_model(hp, *tokenizers)
    path = export.export_saved_model(LoadedModel(hp, *tokenizers, model), str(tmp_path))
    assert path == str(tmp_path / "1")
    sentences = SENTENCES + ["unbekannte wörter"]
    translations, scores = served(tf.saved_model.load(path), inputs=tf.constant(sentences))
    expected, expected_scores = local((hp, *tokenizers, model), sentences, 2, hp.length_penalty)
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # a fresh Python process
def test_fresh_process_with_only_tensorflow_and_text_translates_and_every_op_is_registered(path):
    """The stock model server links core TensorFlow and TensorFlow Text: the op audit compares
    every op of the graph and of every function in its library with the op registry of a
    process that imported only those two (before and after tensorflow_text), which also
    loads the export and translates (``translate_xla`` without Python: test_c_loader.py)."""
    script = textwrap.dedent(f"""
        import json, sys
        import tensorflow as tf
        from tensorflow.python.framework import op_def_registry
        ops = json.loads(sys.stdin.read())
        core = sorted(op for op in ops if op_def_registry.get(op) is not None)
        import tensorflow_text  # registers its ops (the SentencePiece kernels)
        registered = sorted(op for op in ops if op_def_registry.get(op) is not None)
        model = tf.saved_model.load({path!r})
        out = model.signatures["serving_default"](inputs=tf.constant({list(TOY)!r}))
        scored = model.signatures["score"](sources=tf.constant({list(TOY)!r}),
                                           targets=tf.constant({list(TOY.values())!r}))
        print(json.dumps({{
            "translations": [t.decode() for t in out["translations"].numpy()],
            "scores": scored["scores"].numpy().tolist(),
            "core": core, "registered": registered,
            "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("tf_transformer", "tests")),
        }}))
    """)
    graph = read_saved_model(path).meta_graphs[0].graph_def
    functions = {f.signature.name for f in graph.library.function}
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    ops = {node.op for node in nodes} - functions  # a node may call a library function by name
    assert "While" in ops and "StatefulPartitionedCall" in ops  # the decoder's loop, inside functions

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", script], input=json.dumps(sorted(ops)), capture_output=True,
                            text=True, env=env, cwd="/", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["translations"] == list(TOY.values())
    assert len(answer["scores"]) == len(TOY) and all(-1 < score < 0 for score in answer["scores"])
    assert answer["modules"] == []
    unregistered = ops - set(answer["registered"])
    assert not unregistered, f"not registered by TensorFlow or TensorFlow Text: {unregistered}"
    assert not ops & FORBIDDEN_OPS
    # The audit does tell core ops from others: the tokenizer's come from TensorFlow Text.
    text_ops = set(answer["registered"]) - set(answer["core"])
    assert {"SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp"} <= text_ops


def test_the_export_holds_warm_up_requests_that_its_signatures_answer_as_direct_calls(path, saved, toy_loaded):
    """TF Serving replays assets.extra/tf_serving_warmup_requests while it loads a version, and a request that
    fails fails the load: one request a decoding path a server runs without flags (not translate_xla, which
    needs one), each of the signature's inputs with its dtype, each answered as the same call made directly."""
    requests = read_warmup_requests(path)
    assert [r.signature for r in requests] == ["serving_default", "translate", "translate", "score"]
    assert [int(r.inputs["beam_size"]) for r in requests if r.signature == "translate"] == [1, toy_loaded.hp.beam_size]
    for request in requests:
        specs = saved.signatures[request.signature].structured_input_signature[1]
        assert {name: spec.dtype for name, spec in specs.items()} == {
            name: tf.as_dtype(value.dtype) if value.dtype != object else tf.string
            for name, value in request.inputs.items()}, request.signature
        outputs = saved.signatures[request.signature](**{k: tf.constant(v) for k, v in request.inputs.items()})
        if request.signature == "score":
            expected = score_pairs([WARMUP_SENTENCE], [WARMUP_SENTENCE], *toy_loaded.tokenizers, toy_loaded.model,
                                   length_penalty=toy_loaded.hp.length_penalty)
            np.testing.assert_allclose(outputs["scores"].numpy(), [expected[0].normalised], rtol=1e-4, atol=1e-4)
            continue
        beam = int(request.inputs.get("beam_size", toy_loaded.hp.beam_size))
        texts, scores = local(toy_loaded, [WARMUP_SENTENCE], beam, toy_loaded.hp.length_penalty)
        assert [t.decode() for t in outputs["translations"].numpy()] == texts and texts[0]  # it decoded words
        np.testing.assert_allclose(outputs["scores"].numpy(), scores, rtol=1e-4, atol=1e-4)
    assert os.path.isfile(os.path.join(path, "assets.extra", "tf_serving_warmup_requests"))  # where TF Serving reads


def test_saved_model_cli_shows_string_in_string_out_signatures(path):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([cli, "show", "--dir", path, "--tag_set", "serve", "--signature_def", "serving_default"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # Each tensor is printed as "inputs['inputs'] tensor_info:", then "dtype: DT_STRING", "shape: (-1)", "name: ...".
    tensors, lines = {}, result.stdout.splitlines()
    for i, line in enumerate(lines):
        if "tensor_info:" in line:
            tensors[line.split("tensor_info:")[0].strip()] = (lines[i + 1].split(":")[1].strip(),
                                                              lines[i + 2].split(":")[1].strip())
    assert tensors == {"inputs['inputs']": ("DT_STRING", "(-1)"), "outputs['translations']": ("DT_STRING", "(-1)"),
                       "outputs['scores']": ("DT_FLOAT", "(-1)")}
    assert "tensorflow/serving/predict" in result.stdout


def test_the_translate_signature_takes_a_beam_size_with_a_default(path, saved, toy_loaded):
    signature = read_saved_model(path).meta_graphs[0].signature_def["translate"]
    assert {k: (v.dtype, len(v.tensor_shape.dim)) for k, v in signature.inputs.items()} == {
        "inputs": (tf.string.as_datatype_enum, 1), "beam_size": (tf.int32.as_datatype_enum, 0)}
    assert tf.make_ndarray(signature.defaults["beam_size"]) == toy_loaded[0].beam_size == 4
    with pytest.raises(tf.errors.InvalidArgumentError, match="beam_size must be at least 1"):
        served(saved, "translate", inputs=tf.constant(["ich"]), beam_size=tf.constant(0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="beam_size must be at most 64"):
        served(saved, "translate", inputs=tf.constant(["ich"]), beam_size=tf.constant(65))


def test_the_score_signature_scores_pairs_as_the_python_model(path, saved, toy_loaded):
    """Issue 29: sources and targets in, the length-normalised score, the log-probability and the tokens out."""
    hp, source_tokenizer, target_tokenizer, model = toy_loaded
    sources, targets = [*TOY, "ich mochte ein bier", ""], [*TOY.values(), "i want a coke", "i want a beer"]
    out = saved.signatures["score"](sources=tf.constant(sources), targets=tf.constant(targets))
    expected = score_pairs(sources, targets, source_tokenizer, target_tokenizer, model,
                           length_penalty=hp.length_penalty)
    np.testing.assert_allclose(out["scores"].numpy(), [s.normalised for s in expected], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["log_probs"].numpy(), [s.total for s in expected], rtol=1e-4, atol=1e-4)
    assert out["tokens"].numpy().tolist() == [s.tokens for s in expected]
    signature = read_saved_model(path).meta_graphs[0].signature_def["score"]
    assert {k: v.dtype for k, v in signature.inputs.items()} == {"sources": tf.string.as_datatype_enum,
                                                                 "targets": tf.string.as_datatype_enum}
    empty = saved.signatures["score"](sources=tf.constant([], tf.string), targets=tf.constant([], tf.string))
    assert {k: v.shape for k, v in empty.items()} == {"scores": (0,), "log_probs": (0,), "tokens": (0,)}
    with pytest.raises(tf.errors.InvalidArgumentError, match="sources and targets must have the same length"):
        saved.signatures["score"](sources=tf.constant(sources), targets=tf.constant(targets[:1]))


@pytest.fixture
def fake_save(monkeypatch):
    """Replaces tf.saved_model.save by a quick stand-in that records what it was given."""
    calls = []

    def save(obj, path, signatures=None):
        calls.append(obj)
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(b"stand-in")

    monkeypatch.setattr(tf.saved_model, "save", save)
    return calls


def test_versions_count_up_from_the_largest_number(toy_loaded, tmp_path, fake_save):
    export_dir = str(tmp_path / "export")
    assert export.export_saved_model(toy_loaded, export_dir) == os.path.join(export_dir, "1")
    assert export.export_saved_model(toy_loaded, export_dir) == os.path.join(export_dir, "2")
    assert sorted(os.listdir(export_dir)) == ["1", "2"]  # no temporary folder left
    assert sorted(os.listdir(os.path.join(export_dir, "2"))) == ["assets.extra", "saved_model.pb"]  # + warm-up

    for name in ("3", "10", "notes", ".tmp-export-x"):
        (tmp_path / name).mkdir()
    assert export.next_version(str(tmp_path)) == 11
    assert export.next_version(str(tmp_path / "missing")) == 1
    with pytest.raises(UserError, match="exists already.*11"):
        export.export_saved_model(toy_loaded, str(tmp_path), version=10)
    with pytest.raises(UserError, match="--version 0"):
        export.export_saved_model(toy_loaded, str(tmp_path), version=0)


def test_a_failed_export_leaves_no_version_folder(toy_loaded, tmp_path, monkeypatch):
    def fail_half_way(obj, path, signatures=None):
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", fail_half_way)
    with pytest.raises(OSError, match="disk full"):
        export.export_saved_model(toy_loaded, str(tmp_path / "export"))
    assert os.listdir(tmp_path / "export") == []


def test_export_cli_exports_the_checkpoint_it_is_given(toy_dir, toy_loaded, tmp_path, fake_save, capsys):
    model = toy_loaded[-1]
    other = tf.train.Checkpoint(model=model)
    bias = model.logits_layer.bias
    original = bias.numpy()
    bias.assign(original + 1.0)
    checkpoint = other.save(str(tmp_path / "other" / "ckpt"))
    bias.assign(original)

    assert export_cli.main(["--model-dir", toy_dir, "--export-dir", str(tmp_path), "--version", "7",
                        "--checkpoint", checkpoint]) == 0
    assert str(tmp_path / "7") in capsys.readouterr().out
    assert os.path.exists(tmp_path / "7" / "saved_model.pb")
    index = [i for i, v in enumerate(model.variables) if v is bias][0]  # models built alike list them alike
    np.testing.assert_allclose(fake_save[0].model_variables[index].numpy(), original + 1.0)

    assert export_cli.main(["--model-dir", toy_dir, "--export-dir", str(tmp_path)]) == 0
    assert os.path.exists(tmp_path / "8")  # the default: next after the largest
    np.testing.assert_allclose(fake_save[1].model_variables[index].numpy(), original)  # the latest checkpoint
    assert fake_save[1].beam_patience == toy_loaded.hp.beam_patience  # the model's
    assert export_cli.main(["--model-dir", toy_dir, "--export-dir", str(tmp_path), "--beam-patience", "1.5"]) == 0
    assert fake_save[2].beam_patience == 1.5


def test_export_cli_errors_are_one_line(toy_dir, tmp_path, capsys, fake_save):
    def error(*argv):
        assert export_cli.main(list(argv)) == 2
        message = capsys.readouterr().err
        assert message.startswith("error: ") and len(message.strip().splitlines()) == 1
        return message

    assert "ckpt-nope" in error("--model-dir", toy_dir, "--checkpoint", os.path.join(toy_dir, "ckpt-nope"))
    missing = str(tmp_path / "missing")
    assert missing in error("--model-dir", missing)
    (tmp_path / "file").write_text("")
    assert "is a file" in error("--model-dir", toy_dir, "--export-dir", str(tmp_path / "file"))
    (tmp_path / "3").mkdir()
    assert "exists already" in error("--model-dir", toy_dir, "--export-dir", str(tmp_path), "--version", "3")
    assert "--version -1" in error("--model-dir", toy_dir, "--export-dir", str(tmp_path), "--version", "-1")
    assert "--beam-patience -1.0: must be between 0" in error("--model-dir", toy_dir, "--beam-patience", "-1")
    assert "--beam-patience: not an option of --format ctranslate2" in error(
        "--model-dir", toy_dir, "--format", "ctranslate2", "--beam-patience", "1")
    assert fake_save == []


def test_an_export_onto_a_full_disk_is_one_line_with_the_free_space_and_leaves_no_version(tmp_path):
    """Issue 24: a real full disk (a small tmpfs), with the untrained word-vocabulary model of the test above."""
    hp = load_hparams("toy", overrides=["num_units=16", "d_ff=32", "num_blocks=1"])
    tokenizers = WordTokenizer(WordVocab.build(list(TOY))), WordTokenizer(WordVocab.build(list(TOY.values())))
    loaded = LoadedModel(hp, *tokenizers, build_model(hp, *tokenizers))
    with small_disk(tmp_path / "disk", 1024) as disk:
        fill(disk, 32 << 10)
        with pytest.raises(UserError) as raised:
            export.export_saved_model(loaded, os.path.join(disk, "export"))
        message = str(raised.value)
        assert message.startswith(f"--export-dir {disk}/export: cannot write it (No space left on device; ")
        assert message.endswith("free there); no version was written; free some space and export again")
        assert os.listdir(os.path.join(disk, "export")) == []


@pytest.mark.parametrize("greedy_batch, compiled_runs", [(1, 1), (16, 2)])
def test_translate_xla_compiles_greedy_decoding_up_to_its_greedy_batch(toy_loaded, monkeypatch, greedy_batch,
                                                                       compiled_runs):
    """translate_xla decodes a batch larger than ``xla_greedy_batch`` with translate's loop (the same
    translations), and one of at most that many compiled."""
    compiled = tf.Variable(0)
    generate = export.decoding.generate

    def counted(*args, jit_compile=False, **kwargs):
        with tf.control_dependencies([compiled.assign_add(int(jit_compile))]):
            return generate(*args, jit_compile=jit_compile, **kwargs)

    monkeypatch.setattr(export.decoding, "generate", counted)
    translator = export.Translator(*toy_loaded.tokenizers, toy_loaded.model, beam_size=4, xla=True,
                                   xla_greedy_batch=greedy_batch)
    greedy = tf.constant(1)
    for sentences in (SENTENCES[:2], SENTENCES[:1]):
        texts = translator.translate_xla(tf.constant(sentences), greedy)["translations"].numpy().tolist()
        assert texts == translator.translate(tf.constant(sentences), greedy)["translations"].numpy().tolist()
    assert int(compiled.numpy()) == compiled_runs


def test_the_exported_beam_patience_decodes_every_beam_signature(toy_loaded, monkeypatch):
    """``beam_patience`` reaches the decoder of serve, translate and translate_xla: their translations are
    the Python model's with that patience."""
    patiences = []
    generate = export.decoding.generate

    def recorded(*args, patience=0.0, **kwargs):
        patiences.append(patience)
        return generate(*args, patience=patience, **kwargs)

    monkeypatch.setattr(export.decoding, "generate", recorded)
    translator = export.Translator(*toy_loaded.tokenizers, toy_loaded.model, beam_size=4, xla=True, beam_patience=1.0)
    expected = translate(SENTENCES[:1], *toy_loaded.tokenizers, toy_loaded.model, beam_size=4, length_penalty=0.6,
                         patience=1.0)
    four = tf.constant(4)
    for outputs in (translator.serve(tf.constant(SENTENCES[:1])), translator.translate(tf.constant(SENTENCES[:1]), four),
                    translator.translate_xla(tf.constant(SENTENCES[:1]), four)):
        assert [t.decode() for t in outputs["translations"].numpy()] == expected
    assert patiences and set(patiences) == {1.0}


def _reached_nodes(nodes, functions):
    """The nodes of ``nodes`` and of every function they call, inlined or not, as ``(node, caller)``."""
    for node in nodes:
        yield node, None
        for value in node.attr.values():
            for called in [value.func] if value.HasField("func") else list(value.list.func):
                if called.name in functions:
                    yield node, called.name
                    yield from _reached_nodes(functions[called.name].node_def, functions)


def test_translate_xla_tokenizes_once_and_calls_each_growing_loop_as_a_function_of_its_own(toy_loaded):
    """One call of ``translate_xla`` runs one of its four decoders: the tokenizer is in its graph once (not
    once per decoder), the decoder is chosen by one ``Case`` kept a call (lowered, every weight would pass
    through a ``SwitchN``), and the growing loops are calls that a graph does not inline (inlined, every call
    would walk the other loops' thousands of nodes as dead ones)."""
    translator = export.Translator(*toy_loaded.tokenizers, toy_loaded.model, beam_size=4, xla=True)
    graph_def = translator.translate_xla.get_concrete_function().graph.as_graph_def()
    functions = {f.signature.name: f for f in graph_def.library.function}
    reached = list(_reached_nodes(graph_def.node, functions))
    assert sum(node.op == "UnicodeTranscode" for node, called in reached if called is None) == 1
    cases = [node for node, called in reached if called is None and node.op in ("Case", "StatelessCase")]
    assert len(cases) == 1 and not cases[0].attr["_lower_using_switch_merge"].b, cases
    calls = [functions[called] for node, called in reached if called and "PartitionedCall" in node.op]
    growing = [f for f in calls if not f.attr["_XlaMustCompile"].b and any(n.op == "While" for n in f.node_def)]
    assert len(growing) == 2  # greedy decoding and beam search, each once
    assert all(f.attr["_noinline"].b for f in growing)


def test_empty_inputs_translate_to_empty_strings_beside_real_ones_in_every_signature(toy_loaded):
    """An input without words ("" or whitespace) gets "" and score 0 wherever it is in the batch, and a batch of
    nothing but such inputs decodes nothing (each signature's no-sentence branch); the sentence among them gets
    what it gets alone."""
    translator = export.Translator(*toy_loaded.tokenizers, toy_loaded.model, beam_size=4, xla=True)
    calls = {"serving_default": lambda s: translator.serve(s),
             "translate": lambda s: translator.translate(s, tf.constant(4)),
             "translate_xla greedy": lambda s: translator.translate_xla(s, tf.constant(1)),
             "translate_xla beam": lambda s: translator.translate_xla(s, tf.constant(4))}
    for name, call in calls.items():
        alone = call(tf.constant(SENTENCES[:1]))
        mixed = call(tf.constant(["", SENTENCES[0], "   "]))
        assert [t.decode() for t in mixed["translations"].numpy()] == ["", alone["translations"].numpy()[0].decode(),
                                                                        ""], name
        np.testing.assert_allclose(mixed["scores"].numpy(), [0.0, alone["scores"].numpy()[0], 0.0], rtol=1e-5)
        blank = call(tf.constant(["", " "]))
        assert blank["translations"].numpy().tolist() == [b"", b""] and blank["scores"].numpy().tolist() == [0, 0]
