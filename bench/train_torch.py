"""The PyTorch contender of the training benchmark (``bench/train.py``): our configuration built from ``torch.nn``.

:class:`TorchTransformer` is ours at the same hyper-parameters (``small``:
3+3 blocks, 256 units, 4 heads, d_ff 1024): token embeddings scaled by sqrt(C)
with a zero ``<PAD>`` row, the paper's sinusoid positions, dropout, post-norm
``nn.TransformerEncoderLayer``/``nn.TransformerDecoderLayer`` blocks
(``norm_first=False``, as ours: residual, then layer norm, epsilon
``layer_norm_epsilon``; ReLU feed-forward; no final norm), padding masks on
both sides and the causal mask (``tgt_is_causal=True``), an untied output
layer (tied to the one embedding with ``shared_embeddings``), label-smoothed
cross-entropy over the non-pad targets, and Adam with our betas, epsilon,
learning rate (constant or noam) and ``clip_norm``. It has exactly as many
parameters as ours. Differences: torch's layers apply their one dropout rate
also inside the feed-forward (ours does not), and the output layer projects
every target position, pad included (ours only the real ones).

Two forms: eager, and ``torch.compile`` (``dynamic=True``: one compile for
every batch shape; the compile happens in the warm-up, whose seconds the
table notes). ``mixed_bfloat16`` runs the forward pass and the loss under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Torch uses as many threads as
TensorFlow's intra-op pool. The step takes the same (x, y) batches as the
other contenders (TensorFlow tensors or numpy) and returns the loss.

Install: ``pip install -r bench/requirements-torch.txt`` (a CPU build); without
torch the two contenders are skipped.
"""

import math
import os

import numpy as np

from tf_transformer.data.vocab import BOS_ID, PAD_ID

TORCH, TORCH_COMPILE = "torch", "torch-compile"
TORCH_CONTENDERS = (TORCH, TORCH_COMPILE)
INSTALL_TORCH = "pip install -r bench/requirements-torch.txt"


def torch_missing():
    """None when torch imports, else why not."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def torch_threads():
    """TensorFlow's intra-op thread count (its default: the CPUs)."""
    import tensorflow as tf

    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()


def sinusoid_table(length, num_units):
    """The paper's positions as ours computes them (sin at even channels, cos at odd): (length, C) float32."""
    position = np.arange(length, dtype=np.float64)[:, None]
    i = np.arange(num_units)
    angles = position / np.power(10000.0, (2 * (i // 2)) / num_units)[None, :]
    return np.where(i % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


def torch_transformer(hp, vocab, longest):
    """A :class:`TorchTransformer` of ``hp`` (defined on first use: torch imports only then)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class TorchTransformer(nn.Module):
        """Ours in torch.nn: ``(x, y) -> label-smoothed loss`` over the non-pad targets of ``y``."""

        def __init__(self):
            super().__init__()
            c = hp.num_units
            self.scale = math.sqrt(c)
            self.src_embedding = nn.Embedding(vocab, c, padding_idx=PAD_ID)
            self.tgt_embedding = (self.src_embedding if hp.shared_embeddings
                                  else nn.Embedding(vocab, c, padding_idx=PAD_ID))
            for embedding in {id(e): e for e in (self.src_embedding, self.tgt_embedding)}.values():
                nn.init.xavier_uniform_(embedding.weight)  # ours: Glorot-uniform, <PAD> row zero
                with torch.no_grad():
                    embedding.weight[PAD_ID].zero_()
            self.register_buffer("positions", torch.from_numpy(sinusoid_table(max(hp.maxlen, longest) + 1, c)),
                                 persistent=False)
            self.dropout = nn.Dropout(hp.dropout_rate)
            options = dict(d_model=c, nhead=hp.num_heads, dim_feedforward=hp.d_ff, dropout=hp.dropout_rate,
                           activation="relu", layer_norm_eps=hp.layer_norm_epsilon, batch_first=True,
                           norm_first=False)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**options), hp.num_blocks,
                                                 enable_nested_tensor=False)
            self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**options), hp.num_blocks)
            self.logits_bias = nn.Parameter(torch.zeros(vocab)) if hp.shared_embeddings else None
            self.logits = None if hp.shared_embeddings else nn.Linear(c, vocab)

        def forward(self, x, y):
            t = y.shape[1]
            decoder_inputs = torch.cat([torch.full_like(y[:, :1], BOS_ID), y[:, :-1]], dim=1)
            source_pads, target_pads = x == PAD_ID, y == PAD_ID  # the decoder's real positions are the targets'
            enc = self.dropout(self.src_embedding(x) * self.scale + self.positions[:x.shape[1]])
            memory = self.encoder(enc, src_key_padding_mask=source_pads)
            dec = self.dropout(self.tgt_embedding(decoder_inputs) * self.scale + self.positions[:t])
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=y.device), diagonal=1)
            dec = self.decoder(dec, memory, tgt_mask=causal, tgt_is_causal=True, tgt_key_padding_mask=target_pads,
                               memory_key_padding_mask=source_pads)
            logits = (F.linear(dec, self.tgt_embedding.weight, self.logits_bias) if self.logits is None
                      else self.logits(dec))
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                                   ignore_index=PAD_ID, label_smoothing=hp.label_smoothing)

    return TorchTransformer()


def torch_optimizer(hp, model):
    """(Adam with ``hp``'s betas and epsilon, its learning-rate scheduler or None): constant or noam."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=hp.learning_rate, betas=(hp.adam_beta1, hp.adam_beta2),
                                 eps=hp.adam_epsilon, fused=True)
    if hp.lr_schedule == "constant":
        return optimizer, None
    if hp.lr_schedule != "noam":
        raise ValueError(f"lr_schedule={hp.lr_schedule}: the torch contender takes 'constant' or 'noam'")
    warmup = hp.warmup_steps

    def noam(step):  # NoamSchedule over learning_rate: warmup^0.5 * min(step * warmup^-1.5, step^-0.5), from step 1
        step += 1
        return warmup**0.5 * min(step * warmup**-1.5, step**-0.5)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, noam)


def torch_step(hp, batch_set, compiled=False):
    """The torch contender's training step ``(x, y) -> loss`` for a fresh :func:`torch_transformer`:
    eager, or its forward pass and loss through ``torch.compile(dynamic=True)``."""
    import torch

    torch.manual_seed(hp.seed)
    torch.set_num_threads(torch_threads())
    model = torch_transformer(hp, batch_set.vocab, batch_set.longest)
    model.train()
    optimizer, scheduler = torch_optimizer(hp, model)
    loss_of = torch.compile(model, dynamic=True) if compiled else model
    bf16 = hp.precision == "mixed_bfloat16"

    def tensor(ids):
        return torch.from_numpy(np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids, dtype=np.int64))

    def step(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(tensor(x), tensor(y))
        loss.backward()
        if hp.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        return loss.detach()

    step.model = model
    return step


def torch_compile_step(hp, batch_set):
    """:func:`torch_step` through ``torch.compile``."""
    return torch_step(hp, batch_set, compiled=True)
