"""Small batches replayed from CUDA graphs give the eager forward's vectors.

The model here is MPNet's architecture at a tiny size with seeded random weights: these tests
are about the graphs' padding, masking and locking, not about the model. They need no fixture
from conftest, so a GPU machine without the rest of the stack runs them with
`pytest --noconftest tests/embed/test_cuda_graphs.py`.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from embed_service import cuda_graphs, model
from embed_service.backends import load_embedder
from embed_service.cuda_graphs import ROWS, TOKENS, bucket_for, fill_bucket
from embed_service.model import MAX_TOKENS, TransformerEmbedder, pad_batch
from embed_service.settings import EmbedSettings

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
VOCAB = 512


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a tokenizer and an MPNetModel of 2 layers of 64, seeded random weights."""
    from transformers import MPNetConfig, MPNetModel

    folder = tmp_path_factory.mktemp("tiny-mpnet")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(7)
    config = MPNetConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=MAX_TOKENS + 2,
        initializer_range=0.2,  # wide enough that different texts get far-apart vectors
    )
    MPNetModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def _batch(rng: np.random.Generator, lengths: list[int]) -> list[np.ndarray]:
    """Token ids of the given lengths, each between <s> and </s>."""
    return [
        np.concatenate(([0], rng.integers(4, VOCAB, n - 2), [2])).astype(np.int64) for n in lengths
    ]


def _on_cuda(folder: Path, cuda_graphs: bool = True) -> TransformerEmbedder:
    """float32 with fused attention, which the graphs capture."""
    return TransformerEmbedder(
        folder, "cuda", dtype=torch.float32, fused_attention=True, cuda_graphs=cuda_graphs
    )


def test_a_batch_takes_the_smallest_bucket_that_holds_it() -> None:
    assert bucket_for(1, 1) == (1, 16)
    assert bucket_for(1, 17) == (1, 32)
    assert bucket_for(3, 100) == (4, 128)
    assert bucket_for(9, MAX_TOKENS) == (16, 384)
    assert bucket_for(17, 10) is None
    assert bucket_for(1, MAX_TOKENS + 1) is None
    assert TOKENS[-1] == MAX_TOKENS
    assert list(ROWS) == sorted(ROWS)
    assert list(TOKENS) == sorted(TOKENS)


def test_a_batch_fills_its_bucket_over_a_larger_earlier_one() -> None:
    bucket_ids, bucket_mask = np.zeros((4, 32), np.int64), np.zeros((4, 32), np.int64)
    fill_bucket(bucket_ids, bucket_mask, np.full((4, 32), 9), np.ones((4, 32), np.int64), 1)
    ids = np.array([[0, 5, 6, 2], [0, 7, 2, 1]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    fill_bucket(bucket_ids, bucket_mask, ids, mask, pad_id=1)
    np.testing.assert_array_equal(bucket_ids[:2, :4], ids)
    np.testing.assert_array_equal(bucket_mask[:2, :4], mask)
    assert (bucket_ids[:, 4:] == 1).all() and (bucket_mask[:, 4:] == 0).all()
    # Padding rows: pad tokens, the first one attended to, so that the row has a real token.
    assert (bucket_ids[2:] == 1).all()
    np.testing.assert_array_equal(bucket_mask[2:].sum(axis=1), [1, 1])
    assert (bucket_mask[2:, 0] == 1).all()


def test_the_cpu_model_has_no_graphs(tiny_model_dir: Path) -> None:
    embedder = TransformerEmbedder(tiny_model_dir, "cpu", dtype=torch.float32, fused_attention=True)
    assert embedder.graphs is None


def test_a_failed_capture_leaves_the_model_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def out_of_memory(*args: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(cuda_graphs, "CudaGraphs", out_of_memory)
    assert model._capture_graphs(torch.nn.Linear(2, 2), pad_id=1) is None
    assert "EMBED_CUDA_GRAPHS=false" in caplog.text


def test_the_settings_reach_the_model(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    """EMBED_CUDA_GRAPHS is passed on, and EMBED_DTYPE=auto is left to the model, which
    times the dtypes once it has set its threads."""
    loaded: list[dict[str, object]] = []

    class Recorded(TransformerEmbedder):
        def __init__(self, folder: Path, **options: object) -> None:
            loaded.append(options)
            super().__init__(folder, device="cpu", dtype=torch.float32)

    monkeypatch.setattr(model, "TransformerEmbedder", Recorded)
    load_embedder(EmbedSettings(model_dir=tiny_model_dir, device="cpu", cuda_graphs=False))
    load_embedder(EmbedSettings(model_dir=tiny_model_dir, device="cpu", dtype="bfloat16"))
    assert loaded[0]["cuda_graphs"] is False and loaded[0]["dtype"] is None
    assert loaded[1]["cuda_graphs"] is True and loaded[1]["dtype"] == torch.bfloat16


@needs_cuda
def test_replayed_vectors_are_the_eager_ones(tiny_model_dir: Path) -> None:
    """float32, so that any difference beyond rounding shows: a padded token or row that
    leaked into attention or pooling would move the vectors by far more than 1e-4, as would a
    tensor the graph reads that went back to the allocator when it was captured (the eager
    model, loaded second, takes such memory)."""
    graphed = _on_cuda(tiny_model_dir)
    eager = _on_cuda(tiny_model_dir, cuda_graphs=False)
    assert graphed.graphs is not None and eager.graphs is None
    rng = np.random.default_rng(3)
    shapes = [[5], [16], [17, 3, 30], [384, 7, 200, 64, 9, 12, 100, 383], [250] * 5]
    shapes += [[20] * 11, [20] * 17]  # the last past every bucket: eager in both
    for lengths in shapes:
        batch = _batch(rng, lengths)
        replayed, reference = graphed.embed(batch), eager.embed(batch)
        assert replayed.shape == (len(lengths), 64)
        np.testing.assert_allclose(replayed, reference, atol=1e-4)
        if len(batch) <= ROWS[-1]:  # the graph's own output, not an eager fallback
            ids, mask = pad_batch(batch, graphed.pad_id)
            direct = graphed.graphs.embed(ids, mask)
            assert direct is not None
            np.testing.assert_allclose(direct, reference, atol=1e-4)
        if len(batch) > 1:
            assert np.abs(reference[0] - reference[1]).max() > 1e-2  # the texts differ
    assert graphed.graphs.embed(np.ones((17, 20), np.int64), np.ones((17, 20), np.int64)) is None


@needs_cuda
def test_threads_replay_without_mixing_their_batches(tiny_model_dir: Path) -> None:
    """The service runs two model batches at once on CUDA; each must get its own vectors."""
    graphed = _on_cuda(tiny_model_dir)
    eager = _on_cuda(tiny_model_dir, cuda_graphs=False)
    rng = np.random.default_rng(5)
    # 20 texts lie past the graphs: an eager batch runs beside the replays.
    sizes = (1, 2, 3, 20, 1)
    batches = [_batch(rng, [int(n) for n in rng.integers(3, 60, int(k))]) for k in sizes]
    expected = [eager.embed(batch) for batch in batches]
    mismatches: list[int] = []

    def replay(offset: int) -> None:
        for i in range(200):
            index = (i + offset) % len(batches)
            if not np.allclose(graphed.embed(batches[index]), expected[index], atol=1e-4):
                mismatches.append(index)

    threads = [threading.Thread(target=replay, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mismatches == []
