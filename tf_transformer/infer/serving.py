"""Clients of a running TF Serving that serves an export (:mod:`tf_transformer.infer.export`).

* :class:`GrpcClient`: ``PredictionService.Predict`` over gRPC (port 8500),
  with the ``tensorflow-serving-api`` protos;
* :class:`RestClient`: the REST ``:predict`` API (port 8501), JSON over HTTP.

Both send a batch of sentences to ``serving_default``, or, when a beam size
is given, to the ``translate`` signature with its ``beam_size`` input, and
return ``(translations, scores)``. A server that does not answer, or refuses a
request, is a :class:`~tf_transformer.errors.UserError` naming the address.
"""

import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request

from tf_transformer.errors import UserError
from tf_transformer.infer.signatures import BEAM_SIGNATURE, BEAM_SIZE, INPUTS, SCORES, SERVING_SIGNATURE, TRANSLATIONS
from tf_transformer.options import DEFAULT_MODEL_NAME

# gRPC's protos import TensorFlow (seconds): GrpcClient imports them, RestClient needs neither.


def predict_request(signature, inputs, model_name=""):
    """A ``tensorflow.serving.PredictRequest`` of ``signature`` with ``inputs`` ({input name: value}, text as
    bytes): what :class:`GrpcClient` sends and an export's warm-up file holds (:mod:`tf_transformer.infer.warmup`).
    Imports TensorFlow (through the protos)."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature
    for name, value in inputs.items():
        dtype = tf.int32 if name == BEAM_SIZE else tf.string
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
    return request


def request_inputs(sentences, beam_size=None):
    """(signature name, {input name: value}) of a request for ``sentences`` (a list of str)."""
    if beam_size is None:
        return SERVING_SIGNATURE, {INPUTS: list(sentences)}
    return BEAM_SIGNATURE, {INPUTS: list(sentences), BEAM_SIZE: int(beam_size)}


def _texts(values):
    return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in values]


class GrpcClient:
    """TF Serving's ``PredictionService`` at ``HOST:PORT``.

    Example:
      >>> client = GrpcClient("localhost:8500")                         # doctest: +SKIP
      >>> client.translate(["Ich habe keine Zeit."])                    # doctest: +SKIP
      (['I have no time.'], [-1.93])
    """

    def __init__(self, address, model_name=DEFAULT_MODEL_NAME, timeout=60.0):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise UserError(f"--server {address}: expected HOST:PORT, e.g. localhost:8500")
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self.address, self.model_name, self.timeout = address, model_name, timeout
        # Large batches: allow answers beyond gRPC's default 4 MB.
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 << 20)])
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def translate(self, sentences, beam_size=None):
        """list of N str -> (N translations, N float scores)."""
        import grpc
        import tensorflow as tf

        signature, inputs = request_inputs(sentences, beam_size)
        request = predict_request(signature, {**inputs, INPUTS: [s.encode("utf-8") for s in inputs[INPUTS]]},
                                  self.model_name)
        try:
            response = self.stub.Predict(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise UserError(_grpc_problem(self.address, e)) from None
        missing = [name for name in (TRANSLATIONS, SCORES) if name not in response.outputs]
        if missing:
            raise UserError(f"TF Serving at {self.address} answered without {' or '.join(missing)}; is "
                            f"{self.model_name} an export of this project?")
        return _checked_outputs(tf.make_ndarray(response.outputs[TRANSLATIONS]).tolist(),
                                tf.make_ndarray(response.outputs[SCORES]).tolist(), self.address, len(sentences))

    def close(self):
        self.channel.close()


def _grpc_problem(address, error):
    import grpc

    code, details = error.code(), error.details()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"no TF Serving answers at {address} (gRPC {code.name}: {details}); is it running, with -p 8500:8500?"
    return f"TF Serving at {address} refused the request (gRPC {code.name}): {_one_line(details)}"


def _one_line(message):
    """A server's error message on one line: a failed assertion's own text, else the message's words."""
    assertion = re.search(r"assertion failed: \[([^\]]*)\]", message)
    return assertion.group(1) if assertion else " ".join(message.split())


class RestClient:
    """TF Serving's REST API.

    ``url`` is the server (``http://localhost:8501``; the model's ``:predict``
    path is added) or the full ``.../v1/models/NAME[/versions/N]:predict``.
    Requests use the columnar ``{"inputs": {...}}`` format.
    """

    def __init__(self, url, model_name=DEFAULT_MODEL_NAME, timeout=60.0):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UserError(f"--rest {url}: expected an http:// URL, e.g. http://localhost:8501")
        if not parsed.path.endswith(":predict"):
            url = f"{url.rstrip('/')}/v1/models/{model_name}:predict"
        self.url, self.timeout = url, timeout

    def translate(self, sentences, beam_size=None):
        """list of N str -> (N translations, N float scores)."""
        if not sentences:
            return [], []  # TF Serving's REST API has no way to send an empty batch
        signature, inputs = request_inputs(sentences, beam_size)
        body = json.dumps({"signature_name": signature, "inputs": inputs}).encode("utf-8")
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            answer = _exchange(request, self.timeout)
        except urllib.error.HTTPError as e:
            raise UserError(f"TF Serving at {self.url} refused the request (HTTP {e.code}): "
                            f"{_rest_error(e)}") from None
        except TimeoutError:
            raise UserError(f"TF Serving at {self.url} did not answer in full within --timeout "
                            f"{self.timeout:g} s") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise UserError(f"no TF Serving answers at {self.url} ({reason}); is it running, "
                            f"with -p 8501:8501?") from None
        return _rest_outputs(answer, self.url, len(sentences))


def _exchange(request, timeout):
    """The body of the answer to ``request``, all of it within ``timeout`` seconds: connecting, sending
    and reading (a socket's own timeout bounds each read alone, so a server that drips its answer a byte
    at a time would hold it far longer). The exchange runs in a daemon thread that is left behind when
    the time is up.

    Raises:
      TimeoutError: no whole answer in time; else what ``urllib.request.urlopen`` raises.
    """
    done = {}

    def run():
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                done["body"] = answer.read()
        except BaseException as e:  # handed to the caller's thread
            done["error"] = e

    thread = threading.Thread(target=run, name="rest-exchange", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no whole answer within {timeout} s")
    if "error" in done:
        raise done["error"]
    return done["body"]


def _rest_outputs(body, url, count):
    """(translations, scores) of a REST ``:predict`` answer for ``count`` sentences.

    Raises:
      UserError: the answer is not TF Serving's columnar answer of this export (its outputs
        ``translations`` and ``scores``, ``count`` of each), naming what is missing.
    """
    try:
        outputs = json.loads(body)["outputs"]
        return _checked_outputs(outputs[TRANSLATIONS], outputs[SCORES], url, count)
    except KeyError as e:
        problem = f"no {e} in its outputs"
    except (ValueError, TypeError) as e:
        problem = _one_line(str(e))
    raise UserError(f"{url} did not answer as TF Serving serving this export does ({problem})")


def _checked_outputs(translations, scores, where, count):
    """(translations as str, scores as float), ``count`` of each.

    Raises:
      UserError: another number of either, naming ``where`` the answer came from.
    """
    translations, scores = list(translations), [float(s) for s in scores]
    if not len(translations) == len(scores) == count:
        raise UserError(f"{where} answered {len(translations)} {TRANSLATIONS} and {len(scores)} {SCORES} "
                        f"for {count} sentences; is it serving this export?")
    return _texts(translations), scores


def _rest_error(error):
    """The ``{"error": ...}`` message of a TF Serving REST answer, else its body."""
    body = error.read().decode("utf-8", errors="replace")
    try:
        return _one_line(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return _one_line(body) or error.reason
