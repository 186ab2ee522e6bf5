"""tf-transformer: a TensorFlow 2 / Keras port of the original TF1 Transformer for translation.

The package, one folder a part (the README's layout section maps every module):

* :mod:`tf_transformer.nn`: the blog's layers (``modules.py``: ``multihead_attention`` ...) and the
  encoder-decoder (``model.py``), its loss and accuracy.
* :mod:`tf_transformer.data`: corpora on disk, vocabularies and tokenizers, batches, shards, the
  Debian corpus builder.
* :mod:`tf_transformer.train`: a training run, its step, loop, checkpoints, evaluations, schedules,
  averaging, summaries.
* :mod:`tf_transformer.model_dir`: what a model directory holds: its run files, its checks, its checkpoints.
* :mod:`tf_transformer.infer`: decoding, translating, the SavedModel export and its TF Serving clients.
* :mod:`tf_transformer.cli`: the command lines (``train.py`` and ``translate.py`` run two of them); nothing
  else imports them.
* Here: :mod:`~tf_transformer.hparams` (``hparams.yaml``; read by :mod:`~tf_transformer.presets`),
  :mod:`~tf_transformer.options` (bounds, choices and shared defaults), :mod:`~tf_transformer.errors`,
  :mod:`~tf_transformer.files`, :mod:`~tf_transformer.locks`, :mod:`~tf_transformer.cpu`,
  :mod:`~tf_transformer.allocator` (TensorFlow's CPU memory reused), :mod:`~tf_transformer.collector` (Python's
  garbage collector run less often),
  :mod:`~tf_transformer.figures`, :mod:`~tf_transformer.quiet` (TensorFlow's start-up notices).

The module paths of 0.1.0 (``tf_transformer.model``, ``tf_transformer.export`` ...) still import: each is
the module at its new path (:data:`MOVED`); ``tf_transformer.model_files``, split in four, fails with a
one-line message naming the new modules.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from tf_transformer.quiet import filter_tensorflow_import

__version__ = "0.1.0"

# The top-level modules of 0.1.0 and where they live now.
MOVED = {
    "modules": "nn.modules", "model": "nn.model",
    "vocab": "data.vocab", "tokenizer": "data.tokenizer", "corpus": "data.corpus", "data_load": "data.data_load",
    "shards": "data.shards", "datasets": "data.datasets",
    "trainer": "train.run", "training": "train.step", "step_loop": "train.loop", "precision": "train.precision",
    "checkpoints": "train.checkpoints", "schedules": "train.schedules", "average": "train.average",
    "summaries": "train.summaries", "evaluator": "train.evaluate",
    "evaluation": "train.scores", "decoding": "infer.decode", "translation": "infer.translate",
    "export": "infer.export", "serving": "infer.serving", "plotting": "figures",
}
# Modules of 0.1.0 that were split: no one new path to give, so importing them fails with this message.
SPLIT = {
    "model_files": "tf_transformer.model_files was split: load_for_inference is in tf_transformer.infer.load; "
                   "the file names and run files in tf_transformer.model_dir.run_files; the hparams, tokenizer "
                   "and architecture checks in tf_transformer.model_dir.checks; finding and restoring "
                   "checkpoints in tf_transformer.model_dir.checkpoint_files",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``tf_transformer.OLD[.SUB]`` as the module at its new path (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != __name__ or (parts[1] not in MOVED and parts[1] not in SPLIT):
            return None
        if parts[1] in SPLIT:
            raise ImportError(SPLIT[parts[1]], name=fullname)
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        _, old, *rest = spec.name.split(".")
        module = importlib.import_module(".".join([__name__, MOVED[old], *rest]))
        spec.loader_state = module.__spec__  # the import machinery sets module.__spec__ to the old path's
        return module

    def exec_module(self, module):
        """Runs nothing (the module at the new path is imported); gives it back its own spec."""
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.insert(0, _MovedModules())  # before an editable install's finder, which knows only new paths
filter_tensorflow_import()  # a child process of a quiet command: its TensorFlow starts quietly too
