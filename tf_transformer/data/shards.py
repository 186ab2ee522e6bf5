"""Corpora larger than memory: tokenized once into shards of token ids, streamed every epoch.

``input_pipeline: stream`` (or ``auto`` for training files over
:data:`STREAM_ABOVE_BYTES`) replaces :func:`~tf_transformer.data.data_load.encode_pairs`
and the in-memory shuffle:

1. **Prepare once** (:func:`prepare`, by the trainer on first use, the chief of a
   cluster alone): the training split is read a block at a time
   (:class:`~tf_transformer.data.corpus.PairStream`), tokenized in chunks, filtered
   by ``maxlen`` and dealt round-robin into ``ceil(lines / shard_pairs)``
   TFRecord shards in ``MODEL_DIR/shards/`` (each a uniform sample of the
   corpus). A record is one pair: ``[len(x), x..., y...]`` as uint16 (int32 for
   vocabularies over 65,536). ``manifest.json`` names the tokenizers' sha256,
   ``maxlen``, ``shard_pairs``, the corpus' lines, each source file's size and
   mtime, and each shard's pairs, bytes, sha256 and histogram of pair lengths. Everything is written in a temporary
   folder and renamed into place: a killed preparation leaves nothing half-written.
2. **Checked at every start** (:func:`stale_reason`): another tokenizer,
   ``maxlen`` or ``shard_pairs``, a source file changed (size or mtime), a shard
   missing, truncated or corrupted (size, sha256), a manifest that does not add
   up (its shards against the files in the folder, its pairs against the
   corpus' lines) is named in one log line and the shards are prepared again;
   never trained on. A source file that is gone is named, and nothing starts.
3. **Streamed** (:class:`ShardedExamples`): each epoch reads this worker's
   shards (shard i belongs to worker ``i % workers``) in an order fixed by the
   seed and the epoch, each shuffled whole (the shuffle buffer is one shard, so
   memory does not grow with the corpus) and batched by length like the
   in-memory path (:func:`~tf_transformer.data.data_load.batch_by_length`). Since
   a shard's batches are counted from its length histogram
   (:func:`~tf_transformer.data.data_load.count_batches`), a resume at batch N of an
   epoch starts at the shard holding it and skips at most one shard's batches:
   exact resume from two integers, as the in-memory path.
4. **Several workers**: each reads only its own shards with ``batch_tokens /
   workers`` per batch (the global batch keeps the token budget); every worker
   runs the same number of steps per epoch (the largest worker's), the others
   end their epoch with empty batches.
"""

import dataclasses
import gzip
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from tf_transformer.data import data_load
from tf_transformer.data.tokenizer import tokenizer_fingerprint
from tf_transformer.errors import UserError
from tf_transformer.files import replace_directory, write_atomic

SHARDS_SUBDIR = "shards"
MANIFEST_FILE = "manifest.json"
FORMAT = 2  # 2: shard_pairs and lines recorded
_SHARD_NAME = re.compile(r"^train-\d+-of-\d+\.tfrecord$")
# input_pipeline: auto streams when the training files are larger than this.
STREAM_ABOVE_BYTES = 200 * 2**20
_CHUNK = 8192  # pairs tokenized at a time
_WAIT_SECONDS, _POLL_SECONDS = 3600.0, 1.0  # a worker waiting for the chief's shards


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard file: its name in the shards folder, pairs, bytes, sha256, and ``lengths[n]``: the
    pairs whose longer side has n tokens (``</S>`` included)."""

    name: str
    pairs: int
    bytes: int
    sha256: str
    lengths: list


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a shards folder holds and what it was made from (``manifest.json``)."""

    tokenizer: str  # tokenizer_fingerprint
    maxlen: int
    shard_pairs: int
    dtype: str  # of the ids in a record
    sources: list  # of {"path", "size", "mtime_ns"}
    lines: int  # line pairs of the corpus: pairs kept + too_long + blank
    shards: list  # of Shard
    too_long: int
    blank: int
    format: int = FORMAT

    @property
    def pairs(self):
        return sum(shard.pairs for shard in self.shards)

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text):
        values = json.loads(text)
        return cls(**{**values, "shards": [Shard(**shard) for shard in values["shards"]]})


def wants_streaming(hp, split):
    """Whether ``hp.input_pipeline`` streams this training split (``auto``: files over
    :data:`STREAM_ABOVE_BYTES`)."""
    if hp.input_pipeline != "auto":
        return hp.input_pipeline == "stream"
    return sum(os.path.getsize(path) for path in split.files if os.path.exists(path)) > STREAM_ABOVE_BYTES


def shards_directory(model_dir):
    return os.path.join(model_dir, SHARDS_SUBDIR)


def source_records(split):
    """Each training file's absolute path, size and mtime: a changed file makes the shards stale.

    Raises:
      UserError: a training file is missing (naming it).
    """
    records = []
    for path in split.files:
        try:
            status = os.stat(path)
        except OSError as e:
            raise UserError(f"{path}: cannot read this training file ({e.strerror}); the streamed shards are "
                            f"made from it: put it back, or train from where it is now") from None
        records.append({"path": os.path.abspath(path), "size": status.st_size, "mtime_ns": status.st_mtime_ns})
    return records


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory):
    """The :class:`Manifest` of a shards folder, or None when absent, unreadable or of another format."""
    try:
        with open(os.path.join(directory, MANIFEST_FILE)) as f:
            manifest = Manifest.from_json(f.read())
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return manifest if manifest.format == FORMAT else None


def stale_reason(directory, split, tokenizers, hp):
    """Why the shards in ``directory`` cannot be trained on as they are (a phrase), or None.

    Raises:
      UserError: a training file is gone (:func:`source_records`).
    """
    current = source_records(split)
    manifest = read_manifest(directory)
    if manifest is None:
        path = os.path.join(directory, MANIFEST_FILE)
        return f"{path} is missing, unreadable or of an older version" if os.path.exists(directory) else \
            "there are none yet"
    if manifest.tokenizer != tokenizer_fingerprint(*tokenizers):
        return "they were made with another tokenizer"
    for key in ("maxlen", "shard_pairs"):
        if getattr(manifest, key) != getattr(hp, key):
            return f"they were made with {key}={getattr(manifest, key)}, not {getattr(hp, key)}"
    return _changed_source(manifest, current) or _inconsistent(directory, manifest) or \
        _damaged_shard(directory, manifest)


def _changed_source(manifest, current):
    """Which source file changed since the shards were prepared (a phrase), or None."""
    for old, new in itertools.zip_longest(manifest.sources, current, fillvalue={}):
        if old != new:
            return f"{new.get('path') or old.get('path')} changed since they were prepared " \
                   f"(size {old.get('size')} -> {new.get('size')}, mtime {old.get('mtime_ns')} -> " \
                   f"{new.get('mtime_ns')})"
    return None


def _inconsistent(directory, manifest):
    """How the manifest contradicts itself or the folder (a phrase), or None: its shards must be the
    shard files there, as many as ``shard_pairs`` makes of the corpus' lines, and hold every line that
    was neither blank nor too long."""
    files = sorted(name for name in os.listdir(directory) if _SHARD_NAME.match(name))
    listed = sorted(shard.name for shard in manifest.shards)
    if files != listed:
        return (f"{os.path.join(directory, MANIFEST_FILE)} lists {len(listed)} shard(s) but the folder holds "
                f"{len(files)} shard file(s)")
    expected = max(1, -(-manifest.lines // manifest.shard_pairs))
    if len(listed) != expected:
        return f"{len(listed)} shard(s) listed, {expected} expected of {manifest.lines} lines"
    if manifest.pairs + manifest.too_long + manifest.blank != manifest.lines:
        return (f"the manifest's {manifest.pairs} pairs + {manifest.too_long} too long + {manifest.blank} blank "
                f"do not add up to the corpus' {manifest.lines} lines")
    return None


def _damaged_shard(directory, manifest):
    """Which shard is missing, truncated or corrupted (a phrase), or None."""
    for shard in manifest.shards:
        path = os.path.join(directory, shard.name)
        size = os.path.getsize(path) if os.path.exists(path) else None
        if size != shard.bytes:
            return f"{path} is {'missing' if size is None else f'truncated ({size} of {shard.bytes} bytes)'}"
        if sha256_of(path) != shard.sha256:
            return f"{path} is corrupted (its sha256 differs from the manifest's)"
    return None


def _count_lines(path):
    """Lines in a file (gzip when named .gz): the most pairs the split can hold."""
    opener = gzip.open if path.endswith(".gz") else open
    lines, last = 0, b"\n"
    with opener(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            lines, last = lines + block.count(b"\n"), block[-1:]
    return lines + (last != b"\n")


def _records(sources, targets, dtype):
    """(N, None) ragged source and target ids -> N records ``[len(x), x..., y...]`` as bytes."""
    lengths = tf.expand_dims(sources.row_lengths(), 1)
    rows = tf.concat([tf.RaggedTensor.from_tensor(tf.cast(lengths, tf.int32)), sources, targets], axis=1)
    flat = rows.flat_values.numpy().astype(dtype).tobytes()
    offsets = rows.row_splits.numpy() * np.dtype(dtype).itemsize
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def prepare(directory, split, tokenizers, hp, log):
    """Tokenizes ``split`` into shards in ``directory`` (replacing what is there); see the module
    docstring. Returns the :class:`Manifest`.

    Raises:
      UserError: the split's own errors (file, line), or no pair within ``maxlen``.
    """
    started = time.monotonic()
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    for stale in os.listdir(parent):  # what a killed preparation left
        if stale.startswith((".tmp-shards-", ".tmp-old-")):
            shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
    sources = source_records(split)
    lines = _count_lines(split.files[0])
    count = max(1, -(-lines // hp.shard_pairs))
    dtype = "uint16" if max(t.vocab_size for t in tokenizers) <= 2**16 and hp.maxlen < 2**16 else "int32"
    temporary = tempfile.mkdtemp(dir=parent, prefix=".tmp-shards-")
    try:
        names = [f"train-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]
        lengths = np.zeros([count, hp.maxlen + 1], np.int64)
        kept = too_long = 0
        writers = [tf.io.TFRecordWriter(os.path.join(temporary, name)) for name in names]
        stream = split.stream()
        pairs = iter(stream)
        while chunk := list(itertools.islice(pairs, _CHUNK)):
            examples = data_load.encode_pairs(chunk, *tokenizers, hp.maxlen)
            too_long += examples.too_long
            for record, length in zip(_records(examples.sources, examples.targets, dtype), examples.pair_lengths()):
                writers[kept % count].write(record)
                lengths[kept % count, length] += 1
                kept += 1
        for writer in writers:
            writer.close()
        if not kept:
            raise UserError(f"{stream.origin}: no sentence pair of at most maxlen={hp.maxlen} tokens "
                            f"(</S> included); raise it with --set maxlen=N")
        shards = [Shard(name, int(lengths[i].sum()), os.path.getsize(os.path.join(temporary, name)),
                        sha256_of(os.path.join(temporary, name)), lengths[i].tolist())
                  for i, name in enumerate(names)]
        manifest = Manifest(tokenizer_fingerprint(*tokenizers), hp.maxlen, hp.shard_pairs, dtype,
                            sources, lines, shards, too_long, stream.blank)
        write_atomic(os.path.join(temporary, MANIFEST_FILE), manifest.to_json())
        replace_directory(temporary, directory)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    log(f"shards: {kept} pairs of {stream.origin} tokenized into {count} shard(s) in {directory} in "
        f"{time.monotonic() - started:.1f}s")
    return manifest


def open_shards(model_dir, split, tokenizers, hp, chief, log):
    """The checked :class:`Manifest` of ``MODEL_DIR/shards``. The chief prepares them when they are
    missing or stale (saying why); another worker waits until the chief has.

    Raises:
      UserError: a worker waited an hour for them.
    """
    directory = shards_directory(model_dir)
    reason = stale_reason(directory, split, tokenizers, hp)
    if reason is None:
        return read_manifest(directory)
    if chief:
        if os.path.exists(directory):
            log(f"shards in {directory} are stale: {reason}; preparing them again")
        return prepare(directory, split, tokenizers, hp, log)
    deadline = time.monotonic() + _WAIT_SECONDS
    while reason is not None:
        if time.monotonic() > deadline:
            raise UserError(f"waited {_WAIT_SECONDS / 60:.0f} minutes for the chief to prepare {directory} "
                            f"({reason})")
        time.sleep(_POLL_SECONDS)
        reason = stale_reason(directory, split, tokenizers, hp)
    return read_manifest(directory)


class ShardedExamples:
    """The streamed training pairs of one worker; :func:`~tf_transformer.train.step.epoch_batches` and
    :func:`~tf_transformer.train.step.count_batches` take it in place of
    :class:`~tf_transformer.data.data_load.Examples`.

    Args:
      directory: the shards folder.
      manifest: its :class:`Manifest`, checked.
      worker, workers: this worker's index and the number of workers.
    """

    def __init__(self, directory, manifest, worker=0, workers=1):
        self.directory, self.manifest, self.worker, self.workers = directory, manifest, worker, workers
        self.too_long = manifest.too_long

    def __len__(self):
        return self.manifest.pairs

    def own_shards(self, worker=None):
        """Indices of the shards a worker reads (this one by default)."""
        worker = self.worker if worker is None else worker
        return list(range(worker, len(self.manifest.shards), self.workers))

    def worker_hp(self, hp):
        """``hp`` with one worker's share of the global batch.

        Raises:
          UserError: the share is too small for a pair of ``maxlen`` tokens, or ``batch_size`` does not divide.
        """
        if self.workers == 1:
            return hp
        if hp.batch_tokens:
            share = hp.batch_tokens // self.workers
            if share < hp.maxlen:
                raise UserError(f"batch_tokens={hp.batch_tokens} over {self.workers} workers leaves {share} "
                                f"tokens a worker, fewer than maxlen={hp.maxlen}; raise batch_tokens")
            return hp.replace(batch_tokens=share)
        if hp.batch_size % self.workers:
            raise UserError(f"batch_size={hp.batch_size} does not divide among {self.workers} workers")
        return hp.replace(batch_size=hp.batch_size // self.workers)

    def shard_batches(self, hp):
        """Batches of each shard, at one worker's share of the batch."""
        local = self.worker_hp(hp)
        return [data_load.count_batches(shard.lengths, local) for shard in self.manifest.shards]

    def count_batches(self, hp):
        """Steps in one epoch: the batches of the worker with the most."""
        batches = self.shard_batches(hp)
        return max(sum(batches[i] for i in self.own_shards(w)) for w in range(self.workers))

    def shard_order(self, hp, epoch):
        """This worker's shards in epoch ``epoch``'s order (fixed by ``hp.seed`` and the epoch)."""
        rng = np.random.default_rng([hp.seed, epoch])
        return [self.own_shards()[i] for i in rng.permutation(len(self.own_shards()))]

    def _parse(self, record):
        """One record -> (x, y): 1-D int32 ids."""
        ids = tf.cast(tf.io.decode_raw(record, tf.as_dtype(self.manifest.dtype)), tf.int32)
        return ids[1:ids[0] + 1], ids[ids[0] + 1:]

    def epoch_batches(self, hp, epoch, skip=0):
        """The batches of epoch ``epoch`` from batch ``skip`` on, then empty batches up to
        :meth:`count_batches`: a ``tf.data.Dataset`` of (x, y).

        One pipeline streams the shards in turn (``flat_map`` over the shard order,
        so a shard is opened only when the previous one is done): each is shuffled
        whole with a seed of its own and batched by length, so its batches can be
        counted from its histogram and a resume skips into the shard holding batch
        ``skip``.
        """
        local = self.worker_hp(hp)
        batches = self.shard_batches(hp)
        names, pairs, seeds, skips = [], [], [], []
        done = 0
        for index in self.shard_order(hp, epoch):
            count = batches[index]
            if done + count > skip:
                shard = self.manifest.shards[index]
                names.append(os.path.join(self.directory, shard.name))
                pairs.append(max(shard.pairs, 1))
                seeds.append((((hp.seed * 1_000_003 + epoch) * 1_000_003 + index)) % 2**63)
                skips.append(max(skip - done, 0))
            done += count

        def shard_batches(name, size, seed, skipped):
            # The shard's records read whole and permuted by a stateless shuffle of (seed, 0): the
            # order depends on nothing else. (Dataset.shuffle with a tensor seed fails to trace when
            # the global seed is 0, as keras.utils.set_random_seed(hp.seed=0) leaves it.)
            records = tf.data.TFRecordDataset(name, buffer_size=1 << 20).batch(size)
            records = records.map(lambda r: tf.gather(r, tf.random.experimental.stateless_shuffle(
                tf.range(tf.size(r)), seed=tf.stack([seed, tf.zeros_like(seed)])))).unbatch()
            records = records.map(self._parse, num_parallel_calls=tf.data.AUTOTUNE)
            return data_load.batch_by_length(records, local).skip(skipped)

        width = hp.maxlen if hp.pad_to_maxlen else 1
        empty = tf.zeros([0, width], tf.int32)
        padding = tf.data.Dataset.from_tensors((empty, empty)).repeat(self.count_batches(hp) - max(done, skip))
        if not names:
            return padding.prefetch(tf.data.AUTOTUNE)
        order = tf.data.Dataset.from_tensor_slices((names, tf.constant(pairs, tf.int64),
                                                    tf.constant(seeds, tf.int64), tf.constant(skips, tf.int64)))
        return order.flat_map(shard_batches).concatenate(padding).prefetch(tf.data.AUTOTUNE)
