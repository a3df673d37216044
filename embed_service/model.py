"""all-mpnet-base-v2 with transformers: mean pooling over the attention mask, L2 normalization.

Inputs are truncated to 384 tokens (special tokens included), the sequence length the model
was trained with and the one its model card prescribes; text past that point does not change
the vector. On CUDA the model runs in bf16 (fp16 where bf16 is unsupported) and replays small
batches from CUDA graphs (embed_service.cuda_graphs); on the CPU it runs in bf16 where the CPU
multiplies bf16 in hardware and faster than fp32 (timed at load), else in fp32, with one
intra-op thread per core.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from embed_service import mpnet_sdpa
from embed_service.assembly import MODEL_NAME
from embed_service.embedder import TokenIds, Vectors

if TYPE_CHECKING:
    from embed_service.cuda_graphs import CudaGraphs

log = logging.getLogger(__name__)

MAX_TOKENS = 384
# Tokenizing costs time in a text's length, and the model reads only its first 384 tokens. A
# text is tokenized from a prefix first: with the BERT tokenizer, its whole words within the
# first _PREFIX_CHARS characters, cut before a space or line break. The BERT normalizer
# changes characters in place (lower-casing; combining marks never move across a space) and
# the BERT pre-tokenizer splits words at whitespace, so that prefix's tokens are the whole
# text's first tokens. A prefix that yields fewer than 384 tokens is followed by one 8 times
# as long, and so on up to the whole text: a text of long words (a word over 100 characters is
# one [UNK]) or of long runs of whitespace takes a pass or two more, and none loses the words
# past its prefix. LongMemEval windows of 5 messages (median 4,970 characters) took 3.0-3.5 ms
# of CPU each outright and 1.8-2.0 ms with the prefix (benchmarks/embed/bench_tokenize.py).
_PREFIX_CHARS = 8 * MAX_TOKENS
# A tokenizer of other kinds starts from this many characters, cut anywhere: natural text
# averages under 6 characters a token, so they hold its first 384 tokens.
_CLIP_CHARS = 64 * MAX_TOKENS
# Each prefix after the first is this many times as long as the one before.
_PREFIX_GROWTH = 8
# bfloat16 is picked on a CPU only this many times as fast as float32, so that timing noise
# does not flip the choice where the two are close.
_BFLOAT16_MARGIN = 1.2


def _usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pick_device(requested: str) -> str:
    """'cuda' when asked for or when 'auto' finds a GPU, else 'cpu'."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("EMBED_DEVICE=cuda but no CUDA device is available")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def native_cpu_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX); elsewhere
    PyTorch emulates it, slower than float32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


def cpu_bfloat16_speedup() -> float:
    """How many times as fast this CPU computes a layer-sized product (128 tokens of 768 into
    3,072) in bfloat16 as in float32: the best of 6 alternated timings of each.

    A CPU flag does not tell it. On a 2-core Intel Xeon (family 6 model 207) that reports
    AVX512-BF16 but no AMX, bfloat16 products ran at 0.55-0.9x float32's speed (oneDNN's
    kernel against MKL's) and the model embedded 384-token windows 1.2x slower (464 against
    393 ms, benchmarks/embed/cpu_dtype.py); on a Zen 5 the model ran 3.3-3.8x as fast in
    bfloat16."""
    tokens = torch.randn(128, 768)
    weights = torch.randn(3072, 768)
    pairs = {
        torch.float32: (tokens, weights),
        torch.bfloat16: (tokens.bfloat16(), weights.bfloat16()),
    }
    best = dict.fromkeys(pairs, float("inf"))
    with torch.inference_mode():
        for _ in range(6):  # the first of each also builds the kernel
            for dtype, (x, w) in pairs.items():
                started = time.perf_counter()
                torch.nn.functional.linear(x, w)
                best[dtype] = min(best[dtype], time.perf_counter() - started)
    return best[torch.float32] / best[torch.bfloat16]


def pick_dtype(requested: str, device: str) -> torch.dtype:
    """The compute dtype: as asked, or for 'auto' bfloat16 on CUDA (float16 where it lacks
    bfloat16), and on a CPU bfloat16 where it multiplies bfloat16 in hardware and at least
    _BFLOAT16_MARGIN times as fast as float32 (timed: `cpu_bfloat16_speedup`), else float32.

    On a 2-core AMD EPYC (Zen 5) bfloat16 with fused attention embedded a question 3.3x and a
    5-message window 3.8x as fast as float32, with vectors at cosine 0.99993 or more to
    float32's (benchmarks/embed/cpu_dtype.py): the precision CUDA has always run in."""
    if requested == "auto":
        if device == "cuda":
            # Emulated bfloat16 (before Ampere) passes the default check and runs slowly.
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            return torch.bfloat16 if native else torch.float16
        if not native_cpu_bfloat16():
            return torch.float32
        speedup = cpu_bfloat16_speedup()
        chosen = torch.bfloat16 if speedup >= _BFLOAT16_MARGIN else torch.float32
        log.info(
            "bfloat16 products ran %.2fx as fast as float32 on this CPU: computing in %s",
            speedup,
            str(chosen).removeprefix("torch."),
        )
        return chosen
    dtype: torch.dtype = getattr(torch, requested)
    return dtype


class TransformerEmbedder:
    """The sentence-transformers recipe of all-mpnet-base-v2 on plain transformers."""

    def __init__(
        self,
        folder: Path,
        device: str = "cpu",
        threads: int | None = None,
        fused_attention: bool | None = None,
        dtype: torch.dtype | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        """Load tokenizer and weights from `folder`; never contacts a model hub.

        `dtype` defaults to `pick_dtype("auto", device)`. `fused_attention` (default: on in
        bfloat16 and float16, off in float32) runs the encoder through `mpnet_sdpa` instead of
        transformers' eager attention. `cuda_graphs` captures the fused encoder for small
        batches on CUDA (embed_service.cuda_graphs); it does nothing on the CPU or with eager
        attention.
        """
        from transformers import AutoModel  # imported here: it is slow and only this needs it

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self._device = torch.device(device)
        if device == "cpu":
            torch.set_num_threads(threads or _usable_cores())
        if dtype is None:
            dtype = pick_dtype("auto", device)
        self._dtype = dtype
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self._cuts_at_whitespace = (
            isinstance(self._tokenizer.normalizer, normalizers.BertNormalizer)
            and isinstance(self._tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and isinstance(self._tokenizer.model, models.WordPiece)
        )
        pad_id = self._tokenizer.token_to_id("<pad>")
        self._pad_id = 1 if pad_id is None else pad_id
        model: Any = AutoModel.from_pretrained(folder, local_files_only=True, dtype=dtype)
        self._model: torch.nn.Module = model.to(self._device).eval()
        fused_by_default = dtype != torch.float32
        self._fused = fused_by_default if fused_attention is None else fused_attention
        if device == "cuda":
            # cuDNN's attention builds a plan at the first call of each (batch, length) shape,
            # in each thread: 55-140 ms each on an H200, against 5-10 ms for the first call of
            # a shape without it, and a service meets new shapes for as long as it runs.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self._graphs: CudaGraphs | None = None
        graphs = "no CUDA graphs"
        if cuda_graphs and device == "cuda":
            if self._fused:
                self._graphs = _capture_graphs(self._model, self._pad_id)
                graphs = "CUDA graphs" if self._graphs else "no CUDA graphs: capture failed"
            else:
                graphs = "no CUDA graphs: they need fused attention (EMBED_FUSED_ATTENTION=on)"
        self._dim = int(model.config.hidden_size)
        self._params = sum(p.numel() for p in model.parameters())
        log.info(
            "loaded %s on %s (%s, %s attention, %s)",
            MODEL_NAME,
            device,
            str(dtype).removeprefix("torch."),
            "fused" if self._fused else "eager",
            graphs,
        )

    @property
    def name(self) -> str:
        """Model identifier returned to clients."""
        return MODEL_NAME

    @property
    def dim(self) -> int:
        """Vector dimension (768)."""
        return self._dim

    @property
    def device(self) -> str:
        """'cpu' or 'cuda'."""
        return self._device.type

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype of the weights."""
        return self._dtype

    @property
    def model(self) -> torch.nn.Module:
        """The underlying MPNetModel (read-only use: FLOP counts, benchmarks)."""
        return self._model

    @property
    def graphs(self) -> CudaGraphs | None:
        """The CUDA graphs small batches replay from, or None where the model has none."""
        return self._graphs

    @property
    def pad_id(self) -> int:
        """The token id that pads a batch's shorter texts (masked out of attention)."""
        return self._pad_id

    def tokenize(self, texts: Sequence[str]) -> list[TokenIds]:
        """Token ids with <s> and </s>, truncated to 384 tokens; thread-safe. Each text is
        tokenized from a prefix, then from longer ones while a prefix yields fewer than 384
        tokens and the text goes on past it (_PREFIX_CHARS)."""
        ids: list[TokenIds] = [np.empty(0, dtype=np.int64)] * len(texts)
        todo = list(range(len(texts)))
        chars = _PREFIX_CHARS if self._cuts_at_whitespace else _CLIP_CHARS
        while todo:
            prefixes = [(i, self._prefix(texts[i], chars)) for i in todo]
            later = [i for i, piece in prefixes if piece is None]  # nowhere to cut yet
            pieces = [(i, piece) for i, piece in prefixes if piece is not None]
            encodings = self._tokenizer.encode_batch([piece for _, piece in pieces])
            for (i, piece), encoding in zip(pieces, encodings, strict=True):
                if len(encoding.ids) < MAX_TOKENS and len(piece) < len(texts[i]):
                    later.append(i)
                else:
                    ids[i] = np.asarray(encoding.ids, dtype=np.int64)
            todo, chars = later, chars * _PREFIX_GROWTH
        return ids

    def _prefix(self, text: str, chars: int) -> str | None:
        """The text, if no longer than `chars`; else its first `chars` characters, cut before
        their last space or line break where the tokenizer splits words at whitespace (None
        if they hold neither: a cut inside a word could give it other tokens)."""
        if len(text) <= chars:
            return text
        head = text[:chars]
        if not self._cuts_at_whitespace:
            return head
        cut = max(head.rfind(" "), head.rfind("\n"))
        return head[:cut] if cut > 0 else None

    def embed(self, batch: Sequence[TokenIds]) -> Vectors:
        """Pad the batch, run the encoder, mean-pool over real tokens, L2-normalize."""
        ids, mask = pad_batch(batch, self._pad_id)
        if self._graphs is not None:
            replayed = self._graphs.embed(ids, mask)
            if replayed is not None:
                return replayed
        cuda = self._device.type == "cuda"
        input_ids = torch.from_numpy(ids)
        attention = torch.from_numpy(mask)
        if cuda:
            # Pinned host memory lets the copy run asynchronously with the previous batch.
            input_ids = input_ids.pin_memory().to(self._device, non_blocking=True)
            attention = attention.pin_memory().to(self._device, non_blocking=True)
        with torch.inference_mode():
            if self._fused:
                hidden = mpnet_sdpa.encode(self._model, input_ids, attention)
            else:
                hidden = self._model(
                    input_ids=input_ids, attention_mask=attention
                ).last_hidden_state
            result: Vectors = pooled_unit_vectors(hidden, attention).cpu().numpy()
            return result


def _capture_graphs(model: torch.nn.Module, pad_id: int) -> CudaGraphs | None:
    """The CUDA graphs of small batches, or None, said in the log, where capturing fails (out
    of GPU memory, say): the model then runs every batch eagerly."""
    from embed_service.cuda_graphs import CudaGraphs  # it builds on this module

    try:
        return CudaGraphs(model, pad_id)
    except RuntimeError:  # torch.cuda.OutOfMemoryError among them
        log.warning(
            "capturing CUDA graphs failed; every batch runs eagerly "
            "(EMBED_CUDA_GRAPHS=false skips the attempt)",
            exc_info=True,
        )
        return None


def pad_batch(batch: Sequence[TokenIds], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids padded to the batch's longest with `pad_id`, and the attention mask (1 on a
    real token), both (texts, longest) int64."""
    width = max(len(ids) for ids in batch)
    ids = np.full((len(batch), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def pooled_unit_vectors(hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """Mean of each row's hidden states over its real tokens, L2-normalized, in fp32."""
    weights = attention.unsqueeze(-1).to(torch.float32)
    # Pool in fp32: summing up to 384 bf16 rows loses precision otherwise.
    pooled = (hidden.to(torch.float32) * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    return torch.nn.functional.normalize(pooled, p=2.0, dim=1)
