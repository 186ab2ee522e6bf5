"""The TF Serving contract: a gRPC PredictionService and a REST stand-in backed by the export,
answering translate.py --server / --rest, and every bad request answered."""

import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.toy_model import TOY, toy_export, toy_model_dir
from tf_transformer.cli import translate as translate_cli
from tf_transformer.errors import UserError
from tf_transformer.infer import serving
from tf_transformer.infer.load import load_for_inference
from tf_transformer.infer.translate import translate_nbest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_NAME = "transformer"
_GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}


class Export:
    """The export loaded as the model server loads it: signatures by name, with their defaults."""

    def __init__(self, path):
        self.model = tf.saved_model.load(path)
        saved_model = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            saved_model.ParseFromString(f.read())
        self.signature_defs = saved_model.meta_graphs[0].signature_def
        self.lock = threading.Lock()

    def predict(self, signature_name, inputs):
        """{alias: numpy value} -> {alias: numpy value}; missing inputs take the SignatureDef's
        defaults, as TF Serving's GetInputValues does. Raises ValueError (a bad request) or
        tf.errors.OpError (the graph refused it)."""
        name = signature_name or "serving_default"
        if name not in self.signature_defs or name.startswith("__"):
            raise ValueError(f'Serving signature key "{name}" not found.')
        signature = self.signature_defs[name]
        extra = set(inputs) - set(signature.inputs)
        if extra:
            raise ValueError(f"input size does not match signature: sent extra {sorted(extra)}")
        feeds = {}
        for alias, info in signature.inputs.items():
            if alias in inputs:
                value = inputs[alias]
            elif alias in signature.defaults:
                value = tf.make_ndarray(signature.defaults[alias])
            else:
                raise ValueError(f"Signature input alias: {alias} not found in request and no default value provided")
            feeds[alias] = tf.constant(value, tf.dtypes.as_dtype(info.dtype))
        with self.lock:  # the model server runs requests in parallel; one at a time is enough here
            outputs = self.model.signatures[name](**feeds)
        return {alias: tensor.numpy() for alias, tensor in outputs.items()}


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """TF Serving's gRPC Predict, backed by :class:`Export`: errors become gRPC statuses."""

    def __init__(self, export):
        self.export = export

    def Predict(self, request, context):
        if request.model_spec.name != MODEL_NAME:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"Servable not found for request: Latest({request.model_spec.name})")
        inputs = {alias: tf.make_ndarray(proto) for alias, proto in request.inputs.items()}
        try:
            outputs = self.export.predict(request.model_spec.signature_name, inputs)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except tf.errors.OpError as e:
            context.abort(_GRPC_CODES[e.error_code], e.message)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = MODEL_NAME
        response.model_spec.signature_name = request.model_spec.signature_name or "serving_default"
        for alias, value in outputs.items():
            response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
        return response


@contextlib.contextmanager
def grpc_server(export):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(export), server)
    port = server.add_insecure_port("localhost:0")
    server.start()
    try:
        yield f"localhost:{port}"
    finally:
        server.stop(grace=None)


def rest_handler(export):
    """TF Serving's REST :predict, both formats: "instances" (rows) answered as "predictions",
    "inputs" (columns) answered as "outputs"; errors as {"error": ...} with HTTP 400/404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            if not re.fullmatch(rf"/v1/models/{MODEL_NAME}(/versions/\d+)?:predict", self.path):
                return self.answer(404, {"error": f"Servable not found for request: {self.path}"})
            try:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                signature = export.signature_defs[request.get("signature_name") or "serving_default"]
                if "instances" in request:
                    if len(signature.inputs) > 1 or not request["instances"]:
                        raise ValueError("instances must be a non-empty plain list for a one-input signature")
                    inputs = {list(signature.inputs)[0]: np.array(request["instances"], object)}
                else:
                    inputs = request["inputs"]
                    inputs = inputs if isinstance(inputs, dict) else {list(signature.inputs)[0]: inputs}
                    missing = set(signature.inputs) - set(inputs)
                    if missing:
                        raise ValueError(f"Missing named input: {sorted(missing)[0]} in 'inputs' object.")
                inputs = {k: np.array([s.encode() for s in v], object) if k == "inputs" else v
                          for k, v in inputs.items()}
                outputs = export.predict(request.get("signature_name"), inputs)
            except (ValueError, KeyError, tf.errors.OpError) as e:
                return self.answer(400, {"error": getattr(e, "message", str(e))})
            outputs = {k: [x.decode() if isinstance(x, bytes) else float(x) for x in v] for k, v in outputs.items()}
            if "instances" in request:
                return self.answer(200, {"predictions": [dict(zip(outputs, row)) for row in zip(*outputs.values())]})
            return self.answer(200, {"outputs": outputs})

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


@contextlib.contextmanager
def http_server(handler):
    """``handler`` (a ``BaseHTTPRequestHandler`` class) serving on a free local port; yields its URL."""
    server = http.server.ThreadingHTTPServer(("localhost", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def rest_server(export):
    return http_server(rest_handler(export))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return Export(toy_export(tmp_path_factory))


@pytest.fixture(scope="module")
def grpc_address(export):
    with grpc_server(export) as address:
        yield address


@pytest.fixture(scope="module")
def rest_url(export):
    with rest_server(export) as url:
        yield url


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_for_inference(toy_model_dir(tmp_path_factory))


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a fresh process; trains and exports the shared model when it runs first
def test_translate_py_server_talks_to_a_prediction_service(grpc_address):
    """The user's command, in a fresh process, against a gRPC server speaking TF Serving's protos."""
    sources = list(TOY)[::-1] + [""]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "--server", grpc_address,
                             "--batch-size", "2"], input="\n".join(sources) + "\n", capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n") == [TOY[s] for s in sources[:-1]] + ["", ""]


@pytest.mark.slow  # loads the model and traces its decoder
def test_grpc_beam_size_picks_the_translate_signature(grpc_address, export, loaded):
    client = serving.GrpcClient(grpc_address)
    _, source_tokenizer, target_tokenizer, model = loaded
    sentences = [*TOY, "ich mochte", "ein ein ein"]
    translations, scores = client.translate(sentences, beam_size=1)
    greedy = translate_nbest(sentences, source_tokenizer, target_tokenizer, model, beam_size=1)
    assert translations == [hypotheses[0][0] for hypotheses in greedy]
    np.testing.assert_allclose(scores, [hypotheses[0][1] for hypotheses in greedy], rtol=1e-4, atol=1e-4)
    beam = export.predict("translate", {"inputs": np.array([s.encode() for s in sentences], object),
                                        "beam_size": np.int32(3)})
    assert client.translate(sentences, beam_size=3)[0] == [t.decode() for t in beam["translations"]]
    client.close()


def test_a_request_without_beam_size_takes_the_signature_default(grpc_address):
    """What TF Serving does with SignatureDef.defaults: the translate signature without beam_size."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(grpc_address))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.model_spec.signature_name = "translate"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([s.encode() for s in TOY]))
    response = stub.Predict(request, timeout=60)
    assert [t.decode() for t in tf.make_ndarray(response.outputs["translations"])] == list(TOY.values())


def test_translate_py_rest_talks_to_the_rest_api(rest_url, capsys):
    assert translate_cli.main(["--rest", rest_url, *TOY]) == 0
    assert capsys.readouterr().out.splitlines() == list(TOY.values())
    assert translate_cli.main(["--rest", f"{rest_url}/v1/models/{MODEL_NAME}:predict", "--beam-size", "1",
                           list(TOY)[0]]) == 0
    assert capsys.readouterr().out.splitlines() == [list(TOY.values())[0]]


def test_the_readme_curl_request(rest_url):
    """The README's example, row format: {"instances": [...]} -> {"predictions": [{...}]}."""
    body = json.dumps({"instances": list(TOY)}).encode()
    request = urllib.request.Request(f"{rest_url}/v1/models/{MODEL_NAME}:predict", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        predictions = json.loads(answer.read())["predictions"]
    assert [p["translations"] for p in predictions] == list(TOY.values())
    assert all(p["scores"] <= 0 for p in predictions)


def translated(client, sentences, **kwargs):
    translations, scores = client.translate(sentences, **kwargs)
    assert len(translations) == len(scores) == len(sentences)
    return translations, scores


def test_bad_requests_get_an_answer_per_input_and_the_server_lives_on(grpc_address, loaded):
    client = serving.GrpcClient(grpc_address)
    tokenizer, maxlen = loaded[1], loaded[0].maxlen
    beer = list(TOY)[0]

    assert translated(client, []) == ([], [])
    assert translated(client, ["", "   ", "\t\n"]) == (["", "", ""], [0.0, 0.0, 0.0])

    # 10,000 characters: cut to the first maxlen - 1 tokens, then </S>.
    long = ("ich mochte ein cola " * 500)[:10_000]
    pieces = tokenizer.processor.encode(long)
    cut = tokenizer.processor.decode(pieces[: maxlen - 1])
    assert len(pieces) > maxlen and len(tokenizer.processor.encode(cut)) == maxlen - 1
    translations, scores = translated(client, [long, cut])
    assert translations[0] == translations[1] and scores[0] == pytest.approx(scores[1], abs=1e-5)

    # Invalid UTF-8 bytes become U+FFFD (the tokenizer's <UNK>).
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([beer.encode() + b" \xff\xfe", b"\xc3", beer.encode()]))
    response = client.stub.Predict(request, timeout=60)
    invalid = [t.decode() for t in tf.make_ndarray(response.outputs["translations"])]
    assert invalid == translated(client, [beer + " \ufffd\ufffd", "\ufffd", beer])[0]
    assert invalid[2] == TOY[beer]

    # 1,000 sentences: one answer each, in order, equal to the answers one at a time.
    varied = [*TOY, "", "ich mochte", "ein bier bitte"]
    batch = [varied[i % len(varied)] for i in range(1000)]
    translations, _ = translated(client, batch)
    one_each = {s: translated(client, [s])[0][0] for s in varied}
    assert translations == [one_each[s] for s in batch]

    with pytest.raises(UserError, match="INVALID_ARGUMENT.*beam_size must be at least 1"):
        client.translate([beer], beam_size=0)
    assert translated(client, [beer])[0] == [TOY[beer]]  # still serving
    client.close()


def test_a_server_that_does_not_answer_is_one_line_naming_it(capsys):
    address = f"localhost:{free_port()}"
    assert translate_cli.main(["--server", address, "--timeout", "5", "hallo"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: no TF Serving answers at {address}") and error.count("\n") == 1
    url = f"http://localhost:{free_port()}"
    assert translate_cli.main(["--rest", url, "--timeout", "5", "hallo"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: no TF Serving answers at {url}/v1/models/{MODEL_NAME}:predict")
    assert error.count("\n") == 1


def test_refusals_are_one_line_with_the_servers_reason(grpc_address, rest_url, capsys):
    assert translate_cli.main(["--server", grpc_address, "--model-name", "other", "hallo"]) == 2
    error = capsys.readouterr().err
    assert "NOT_FOUND" in error and "Servable not found" in error and error.count("\n") == 1
    assert translate_cli.main(["--rest", rest_url, "--beam-size", "0", "hallo"]) == 2
    assert "--beam-size 0" in capsys.readouterr().err  # refused before asking
    with pytest.raises(UserError, match="HTTP 400.*beam_size must be at least 1"):
        serving.RestClient(rest_url).translate(["hallo"], beam_size=0)
    for flag, value in (("--server", "localhost"), ("--rest", "localhost:8501")):
        assert translate_cli.main([flag, value, "hallo"]) == 2
        assert value in capsys.readouterr().err


def odd_server(body, drip_seconds=0.0):
    """An HTTP server answering every POST with ``body`` (bytes), one byte every ``drip_seconds`` if set."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(drip_seconds)
            except OSError:
                pass  # the client gave up

        def log_message(self, *args):
            pass

    return http_server(Handler)


@pytest.mark.parametrize("body, fragment", [
    (b'{"outputs": {"translations": ["a beer"]}}', "no 'scores' in its outputs"),
    (b'{"predictions": []}', "no 'outputs' in its outputs"),
    (b'{"outputs": {"translations": ["a", "b"], "scores": [1, 2]}}', "answered 2 translations and 2 scores for 1"),
    (b'{"outputs": {"translations": ["a"], "scores": ["high"]}}', "could not convert string to float"),
    (b'not json', "Expecting value"),
])
def test_a_rest_answer_that_is_not_this_exports_is_one_line(body, fragment, capsys):
    """Issue 24: an answer without ``scores`` used to end in ``KeyError: 'scores'``."""
    with odd_server(body) as url:
        assert translate_cli.main(["--rest", url, "ich mochte ein bier"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and fragment in error and error.count("\n") == 1, error


def test_a_server_that_drips_its_answer_is_cut_off_at_the_timeout(capsys):
    """Issue 24: one byte a second used to hold --timeout 3 for the whole answer."""
    body = b'{"outputs": {"translations": ["a beer"], "scores": [-1.0]}}'
    with odd_server(body, drip_seconds=0.5) as url:
        started = time.monotonic()
        assert translate_cli.main(["--rest", url, "--timeout", "2", "ich mochte ein bier"]) == 2
        took = time.monotonic() - started
    error = capsys.readouterr().err
    assert error == f"error: TF Serving at {url}/v1/models/{MODEL_NAME}:predict did not answer in full within " \
                    f"--timeout 2 s\n"
    assert took < 5, took
    with odd_server(body) as url:  # the same answer at once is read
        assert serving.RestClient(url).translate(["ich mochte ein bier"]) == (["a beer"], [-1.0])
