"""The real all-mpnet-base-v2: shape, norm, meaning, and independence from batch makeup."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embed_service.assembly import WEIGHTS_SHA256
from embed_service.model import MAX_TOKENS, TransformerEmbedder, pick_dtype

pytestmark = pytest.mark.model


def _embed(model: TransformerEmbedder, texts: list[str]) -> np.ndarray:
    return model.embed(model.tokenize(texts))


def test_vectors_have_768_dims_and_unit_norm(real_model: TransformerEmbedder) -> None:
    vectors = _embed(real_model, ["Hello there.", "A longer sentence about databases.", ""])
    assert vectors.shape == (3, 768)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_paraphrase_scores_closer_than_unrelated(real_model: TransformerEmbedder) -> None:
    anchor, paraphrase, unrelated = _embed(
        real_model,
        [
            "How do I reset my password?",
            "What are the steps to change my login password?",
            "The recipe needs two cups of flour and an egg.",
        ],
    )
    assert anchor @ paraphrase > 0.6
    assert anchor @ paraphrase > anchor @ unrelated + 0.3


def test_same_text_same_vector_in_any_batch(real_model: TransformerEmbedder) -> None:
    text = "[user]: I moved to Lisbon last spring.\n[assistant]: How do you like it?"
    alone = _embed(real_model, [text])[0]
    short_neighbours = _embed(real_model, ["hi", text, "ok"])[1]
    long_neighbours = _embed(real_model, ["word " * 300, text, "another " * 120])[1]
    np.testing.assert_allclose(short_neighbours, alone, atol=1e-3)
    np.testing.assert_allclose(long_neighbours, alone, atol=1e-3)


def test_input_is_truncated_to_384_tokens(real_model: TransformerEmbedder) -> None:
    head = "The quick brown fox jumps over the lazy dog. " * 60  # well past 384 tokens
    ids = real_model.tokenize([head, head + "A different ending entirely."])
    assert [len(i) for i in ids] == [MAX_TOKENS, MAX_TOKENS]
    first, second = real_model.embed(ids)
    np.testing.assert_allclose(first, second, atol=1e-6)


def test_assembled_folder_is_verified(real_model: TransformerEmbedder) -> None:
    from embed_service.assembly import ensure_model_folder, sha256_of
    from tests.embed.conftest import REPO_ROOT

    folder = ensure_model_folder(REPO_ROOT / "var" / "models")
    assert sha256_of(folder / "model.safetensors") == WEIGHTS_SHA256
    assert real_model.name == "all-mpnet-base-v2"


def test_fused_attention_matches_transformers(real_model: TransformerEmbedder) -> None:
    from embed_service import mpnet_sdpa

    texts = ["short", "[user]: where is the station?\n[assistant]: Two blocks north. " * 6]
    ids = real_model.tokenize(texts)
    width = max(len(i) for i in ids)
    input_ids = torch.ones((len(ids), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = torch.from_numpy(seq)
        mask[row, : len(seq)] = 1
    with torch.inference_mode():
        eager = real_model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        fused = mpnet_sdpa.encode(real_model.model, input_ids, mask)
        # The bias made beforehand, as a CUDA graph's capture needs it, changes nothing.
        hidden = real_model.model.embeddings(input_ids=input_ids)
        bias = mpnet_sdpa.position_bias_for(real_model.model, hidden[:1])
        given = mpnet_sdpa.encode(real_model.model, input_ids, mask, bias)
    real = mask.unsqueeze(-1).bool().expand_as(eager)
    torch.testing.assert_close(fused[real], eager[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(given, fused, atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model_leaves_cudnn_attention_out(real_model: TransformerEmbedder) -> None:
    """On CUDA the model turns cuDNN's attention off (a plan per new shape) and still gives
    the CPU's vectors, to bfloat16 precision."""
    from embed_service.assembly import ensure_model_folder
    from tests.embed.conftest import REPO_ROOT

    texts = ["short", "[user]: where is the station?\n[assistant]: Two blocks north. " * 6]
    on_gpu = TransformerEmbedder(ensure_model_folder(REPO_ROOT / "var" / "models"), "cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    cosine = (_embed(on_gpu, texts) * _embed(real_model, texts)).sum(axis=1)
    assert cosine.min() > 0.999


def test_long_texts_get_the_tokens_of_their_whole_text(real_model: TransformerEmbedder) -> None:
    """A long text is tokenized from a prefix of whole words first; the ids must be those of
    the text itself, whether that prefix holds 384 tokens or too few, or cannot be cut, and
    however far past it the text's first 384 tokens reach."""
    from tokenizers import Tokenizer

    from embed_service.assembly import ensure_model_folder
    from embed_service.model import _CLIP_CHARS, _PREFIX_CHARS
    from tests.embed.conftest import REPO_ROOT

    reference = Tokenizer.from_file(
        str(ensure_model_folder(REPO_ROOT / "var" / "models") / "tokenizer.json")
    )
    reference.no_padding()
    reference.enable_truncation(max_length=MAX_TOKENS)
    line = "[user]: I moved to Lisbon last spring, near the river.\n[assistant]: How is it? "
    texts = [
        line * 100,  # the prefix holds 384 tokens
        ("x" * 150 + " ") * 100,  # one [UNK] a word: the prefix holds too few
        # 381 one-token words, then a word across the prefix's end: cut inside it, the
        # prefix would end in a token the text does not have.
        ("hello" + "   ") * 381 + " " * 22 + "hellohello " * 500,
        "École Über Straße naïve Σίσυφος " * 300,
        "https://example.com/a/b?c=d&e=f " * 300,
        "a" * 10_000,  # nowhere to cut
        "東京都" * 3_000,  # a token a character, and no spaces
        "w " * (_PREFIX_CHARS // 2),  # exactly the prefix's length
        "w " * (_PREFIX_CHARS // 2) + "w",
        ("word " * 2_000)[: _CLIP_CHARS + 500],
        "short",
        # Past the first 64 characters a token: a pasted blob (one [UNK]), a run of spaces.
        "QUJD" * 8_000 + " the invoice was paid on Friday" * 20,
        " " * 30_000 + "hello world",
        "\n" * 200_000 + "hello",
    ]
    expected = [e.ids for e in reference.encode_batch(texts)]
    assert [list(ids) for ids in real_model.tokenize(texts)] == expected


def test_bfloat16_on_the_cpu_stays_close_to_float32(real_model: TransformerEmbedder) -> None:
    """bfloat16, which `auto` picks on CPUs that multiply it in hardware (and PyTorch emulates
    elsewhere), with fused attention, gives float32's vectors to cosine 0.9999, the same in
    any batch, and keeps their meaning."""
    from embed_service.assembly import ensure_model_folder
    from tests.embed.conftest import REPO_ROOT

    bf16 = TransformerEmbedder(
        ensure_model_folder(REPO_ROOT / "var" / "models"), "cpu", dtype=torch.bfloat16
    )
    assert bf16.dtype == torch.bfloat16 and bf16._fused
    texts = [
        "How do I reset my password?",
        "What are the steps to change my login password?",
        "The recipe needs two cups of flour and an egg.",
        "[user]: I moved to Lisbon last spring.\n[assistant]: How do you like it? " * 8,
    ]
    vectors = _embed(bf16, texts)
    assert vectors.dtype == np.float32
    assert (vectors * _embed(real_model, texts)).sum(axis=1).min() > 0.9999
    anchor, paraphrase, unrelated, _ = vectors
    assert anchor @ paraphrase > anchor @ unrelated + 0.3
    alone = _embed(bf16, texts[3:])[0]
    with_neighbours = _embed(bf16, ["hi", texts[3], "word " * 300])[1]
    assert alone @ with_neighbours > 0.9999


def test_auto_dtype_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    from embed_service import model

    monkeypatch.setattr(model, "native_cpu_bfloat16", lambda: True)
    monkeypatch.setattr(model, "cpu_bfloat16_speedup", lambda: 3.3)
    assert pick_dtype("auto", "cpu") == torch.bfloat16
    # In hardware but slower than float32 (AVX512-BF16 without AMX on some Xeons).
    monkeypatch.setattr(model, "cpu_bfloat16_speedup", lambda: 0.6)
    assert pick_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(model, "native_cpu_bfloat16", lambda: False)
    monkeypatch.setattr(model, "cpu_bfloat16_speedup", lambda: pytest.fail("timed needlessly"))
    assert pick_dtype("auto", "cpu") == torch.float32
    monkeypatch.undo()
    assert 0 < model.cpu_bfloat16_speedup() < 100  # a ratio of two real timings
    assert pick_dtype("bfloat16", "cpu") == torch.bfloat16
    assert pick_dtype("float32", "cuda") == torch.float32


def test_auto_dtype_on_a_gpu_takes_bfloat16_only_in_hardware(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU before Ampere runs bfloat16 only emulated, which torch's default check counts."""

    def supported(including_emulation: bool = True) -> bool:
        return including_emulation  # a Volta or Turing

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert pick_dtype("auto", "cuda") == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert pick_dtype("auto", "cuda") == torch.bfloat16
