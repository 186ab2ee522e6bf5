"""What the command lines and ``hparams.yaml`` accept, free of TensorFlow: the bounds of values, the choices, and
the defaults shared by the library and the command lines.

The command lines parse their arguments with these alone and import TensorFlow afterwards, so ``--help`` and a
usage error answer at once (TensorFlow's import takes seconds).
"""

# The export refuses larger beams (memory grows with the beam; a server must not fall over).
MAX_BEAM_SIZE = 64
# Seeds that NumPy, Keras and tf.data all take.
MAX_SEED = 2**32 - 1
# Integers become int32 shapes and counters in the graph.
MAX_INT32 = 2**31 - 1
# The longest translation asked for (``max_decode_length``, ``--max-length``): the compiled decoder
# preallocates its caches for it.
MAX_DECODE_LENGTH = 4096
# A sentence of n tokens gets at most n + 50 tokens whatever the factor: one above 51 never binds,
# and a huge one would overflow int32 in the graph.
MAX_LENGTH_FACTOR = 100.0
# Beam patience beyond this waits for more hypotheses than any beam of MAX_BEAM_SIZE ends in a sentence's limit.
MAX_BEAM_PATIENCE = 100.0

# ``--strategy``: one device; tf.distribute.MirroredStrategy; MultiWorkerMirroredStrategy over TF_CONFIG.
STRATEGIES = ("default", "mirrored", "multi_worker")

# The decoder block whose head-averaged attention gives ``--alignments``, as a Python index: the last.
DEFAULT_BLOCK = -1

# The model's name in TF Serving (``--model_name``), which its clients ask for unless told another.
DEFAULT_MODEL_NAME = "transformer"

# The weights' and matmuls' types an export may decode with (``export --precision``).
PRECISIONS = ("float32", "bfloat16")
