"""Tokenizers that run inside the TensorFlow graph.

Two kinds, chosen by ``tokenizer`` in the hyper-parameters:

* ``word``: the blog's vocabulary, whitespace words, one vocabulary per
  language (:class:`WordTokenizer` over a :class:`~tf_transformer.data.vocab.WordVocab`);
* ``sentencepiece``: one joint BPE model for both languages, trained with the
  ``sentencepiece`` trainer (``pad_id=0 unk_id=1 bos_id=2 eos_id=3``, as the
  2019 original) and run by ``tensorflow_text.SentencepieceTokenizer``
  (:class:`SubwordTokenizer`).

Both are ``tf.Module``s whose ``tokenize``/``detokenize`` are TensorFlow ops,
so the training pipeline and the exported SavedModel (:mod:`tf_transformer.infer.export`)
use the very same code; ``to_ids``/``to_texts`` call them on Python lists. Ids 0-3 are ``<PAD>``, ``<UNK>``, ``<S>``, ``</S>`` in both.
"""

import hashlib
import io
import itertools
import re

import sentencepiece
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops import sentencepiece_tokenizer as _tf_text_sentencepiece

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, WordVocab
from tf_transformer.errors import UserError


def trim_output(ids):
    """Decoder output -> the tokens to print: everything before the first ``</S>``,
    without ``<PAD>`` and ``<S>``.

    Masked as a padded tensor (a ragged mask's graph is 4x the nodes, which a one-sentence call of
    the export runs every time).

    Args:
      ids: (N, T) int32 tensor or RaggedTensor.
    Returns:
      (N, None) int32 RaggedTensor.
    """
    ids = ids.to_tensor() if isinstance(ids, tf.RaggedTensor) else tf.convert_to_tensor(ids, tf.int32)  # pads: <PAD>
    before_eos = tf.math.cumsum(tf.cast(ids == EOS_ID, tf.int32), axis=1) == 0
    return tf.ragged.boolean_mask(ids, before_eos & (ids != PAD_ID) & (ids != BOS_ID))


class _Tokenizer(tf.Module):
    """Shared Python conveniences over the graph ops of a subclass."""

    kind = None

    def to_ids(self, sentences):
        """list of str -> list of id lists (no ``</S>``): :meth:`tokenize` in Python."""
        if not sentences:
            return []
        return self.tokenize(tf.constant(sentences, tf.string)).to_list()

    def to_texts(self, ids_batch):
        """Decoder output (a list of id lists) -> list of str, each cut at ``</S>``: :meth:`detokenize`
        in Python."""
        if len(ids_batch) == 0:
            return []
        ids = tf.ragged.constant([[int(i) for i in ids] for ids in ids_batch], dtype=tf.int32,
                                 ragged_rank=1)
        return [s.decode("utf-8") for s in self.detokenize(ids).numpy()]


class WordTokenizer(_Tokenizer):
    """Whitespace words -> ids with a :class:`WordVocab`, as a lookup table in the graph.

    A word is what ``tf.strings.split`` separates (runs of whitespace); unknown
    words become ``<UNK>``.

    Example:
      >>> tokenizer = WordTokenizer(WordVocab.build(["ich mochte ein bier"]))
      >>> tokenizer.tokenize(tf.constant(["ich bier cola"])).to_list()
      [[4, 7, 1]]
      >>> tokenizer.detokenize(tf.ragged.constant([[4, 7, 3, 0]])).numpy()
      array([b'ich bier'], dtype=object)
    """

    kind = "word"

    def __init__(self, vocab, name=None):
        super().__init__(name=name)
        self.vocab = vocab
        self.words = tf.constant(vocab.words, tf.string)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(self.words, tf.range(len(vocab.words), dtype=tf.int32)),
            default_value=UNK_ID)

    @property
    def vocab_size(self):
        return len(self.vocab)

    def fingerprint(self):
        """sha256 of the vocabulary, to tie a checkpoint to the ids it was trained with."""
        return hashlib.sha256("\n".join(self.vocab.words).encode("utf-8")).hexdigest()

    def id_to_token(self, i):
        return self.vocab.words[int(i)]

    def tokenize(self, strings):
        """(N,) string -> (N, None) int32 RaggedTensor."""
        return tf.ragged.map_flat_values(self.table.lookup, tf.strings.split(strings))

    def detokenize(self, ids):
        """(N, T) ids (tensor or ragged) -> (N,) string, cut at ``</S>``, words joined by spaces."""
        tokens = tf.ragged.map_flat_values(tf.gather, self.words, trim_output(ids))
        return tf.strings.reduce_join(tokens, axis=-1, separator=" ")


class _SharedModelResource(_tf_text_sentencepiece._SentencepieceModelResource):
    """tensorflow_text's model resource, under a name of its own.

    tensorflow_text 2.21 creates the resource without a ``shared_name``, so it
    belongs to the op kernel, and anything that clears TensorFlow's kernel
    cache deletes it: ``tf.random.set_seed`` (called by
    ``keras.utils.set_random_seed``) breaks every tokenizer made before it
    (b/318839908 in their code). A named resource lives on; equal models
    share one.
    """

    def __init__(self, model, fingerprint):
        self._shared_name = f"sentencepiece_{fingerprint[:32]}"
        super().__init__(model, name=None)

    def _create_resource(self):
        return _tf_text_sentencepiece.gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model, shared_name=self._shared_name)


class SubwordTokenizer(_Tokenizer):
    """A SentencePiece model run by ``tensorflow_text.SentencepieceTokenizer``.

    Example:
      >>> tokenizer = SubwordTokenizer.train(lines, vocab_size=2000)   # doctest: +SKIP
      >>> ids = tokenizer.tokenize(tf.constant(["Die Straße ist groß."]))  # doctest: +SKIP
      >>> tokenizer.detokenize(ids).numpy()                           # doctest: +SKIP
      array([b'Die Stra\\xc3\\x9fe ist gro\\xc3\\x9f.'], dtype=object)
    """

    kind = "sentencepiece"

    def __init__(self, model_proto, name=None):
        super().__init__(name=name)
        self.model_proto = model_proto
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self.op = tf_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)
        self.op._model_resource = _SharedModelResource(model_proto, self.fingerprint())

    @classmethod
    def train(cls, lines, vocab_size, seed=42):
        """Trains a BPE model on ``lines`` (an iterable of str) with the ``sentencepiece`` trainer.

        Every character of the text is kept (``character_coverage=1.0``);
        characters never seen in training become ``<UNK>``.

        Raises:
          UserError: ``vocab_size`` is larger than the text allows (with the
            largest size that would work) or smaller than its characters need.
        """
        model = io.BytesIO()
        sentencepiece.set_random_generator_seed(seed)  # it samples sentences from large corpora
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_writer=model, model_type="bpe",
                vocab_size=vocab_size, character_coverage=1.0,
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                pad_piece="<PAD>", unk_piece="<UNK>", bos_piece="<S>", eos_piece="</S>",
                input_sentence_size=2_000_000, shuffle_input_sentence=True, seed_sentencepiece_size=1_000_000,
                num_threads=2, minloglevel=2)
        except RuntimeError as e:
            raise UserError(_trainer_problem(str(e), vocab_size)) from None
        return cls(model.getvalue())

    @property
    def vocab_size(self):
        return self.processor.get_piece_size()

    def fingerprint(self):
        return hashlib.sha256(self.model_proto).hexdigest()

    def id_to_token(self, i):
        return self.processor.id_to_piece(int(i))

    def tokenize(self, strings):
        """(N,) string -> (N, None) int32 RaggedTensor of subword ids."""
        return self.op.tokenize(strings)

    def detokenize(self, ids):
        """(N, T) ids (tensor or ragged) -> (N,) string, cut at ``</S>``."""
        return self.op.detokenize(trim_output(ids))


def _trainer_problem(message, vocab_size):
    """The sentencepiece trainer's error as advice, about ``vocab_size`` where it is the cause."""
    if "Vocabulary size too high" in message:
        limit = message.rsplit("<=", 1)[-1].strip(" .")
        return (f"vocab_size={vocab_size} is larger than the training text allows for a subword "
                f"vocabulary; use at most {limit} (--set vocab_size={limit}), or more text")
    if "Vocabulary size is smaller than required_chars" in message:
        # "... required_chars. 20 vs 65. ...": 65 = the text's characters + the 4 special tokens.
        need = re.search(r"(\d+) vs (\d+)", message)
        need = need.group(2) if need else "more"
        return (f"vocab_size={vocab_size} is smaller than the distinct characters of the training "
                f"text and the 4 special tokens need; use at least {need} (--set vocab_size={need})")
    return f"the sentencepiece trainer failed: {message.splitlines()[-1]}"


def train_tokenizers(hp, pairs):
    """New (source, target) tokenizers for ``hp.tokenizer`` from sentence pairs.

    ``pairs``: a list, or anything iterable more than once (a
    :class:`~tf_transformer.data.corpus.PairStream`: nothing is held but what the trainers keep).
    ``sentencepiece`` trains one joint model on both sides and returns it twice.
    """
    def side(index):
        return (pair[index] for pair in pairs)

    if hp.tokenizer == "sentencepiece":
        joint = SubwordTokenizer.train(itertools.chain(side(0), side(1)), hp.vocab_size, hp.seed)
        return joint, joint
    return (WordTokenizer(WordVocab.build(side(0), hp.vocab_size, hp.min_count)),
            WordTokenizer(WordVocab.build(side(1), hp.vocab_size, hp.min_count)))


def tokenizer_fingerprint(source_tokenizer, target_tokenizer):
    """The sha256 of both tokenizers, as a checkpoint and a shard manifest store it (``tokenizer_fingerprint``)."""
    return source_tokenizer.fingerprint() + "/" + target_tokenizer.fingerprint()
