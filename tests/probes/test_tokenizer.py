"""Output tokens counted by a local tokenizer.json instead of streamed chunks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.probes.test_probes_rig import _probe, _run
from tritonwatch.collector.probes import Recorder
from tritonwatch.collector.probes.tokenizer import load_token_counter
from tritonwatch.rig import TritonRig
from tritonwatch.schemas.probes import ProbeConfig


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> str:
    """A real (tiny) Hugging Face tokenizer: words, and every digit a token of its own."""
    vocab = {"[UNK]": 0, "tok": 1, **{str(d): 2 + d for d in range(10)}, "hello": 12, "world": 13}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_tokens_come_from_the_tokenizer_and_tpot_divides_by_them(tokenizer_file: str) -> None:
    config = ProbeConfig(name="p", url="127.0.0.1:1", model="m", tokenizer=tokenizer_file)
    rec = Recorder()
    rec.t0_ns = 0
    for i, text in enumerate([b"hello world", b" tok12", b" tok3"]):  # 3 chunks, 7 tokens
        rec.token(100_000_000 + i * 10_000_000, text)
    count = load_token_counter(tokenizer_file, "p")
    assert count is not None
    result = rec.result(config, "t", "r1", count)
    assert result.tokens == 7
    assert result.ttft_s == pytest.approx(0.1)
    assert result.itl_s == pytest.approx(0.01)  # the observed gap between chunks
    assert result.tpot_s == pytest.approx(0.02 / 6)  # (e2e - ttft) / (tokens - 1)
    # Without a tokenizer the chunks are the tokens.
    assert rec.result(config, "t", "r1").tokens == 3


def test_unavailable_tokenizer_falls_back_to_chunks_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert load_token_counter(str(tmp_path / "missing.json"), "p") is None
    assert "tokenizer" in caplog.text and "counting streamed chunks" in caplog.text
    assert load_token_counter(None, "p") is None


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_live_probe_counts_rig_output_with_the_tokenizer(
    triton_rig: TritonRig, tokenizer_file: str, protocol: str
) -> None:
    # fake_llm streams " tok0" ... " tok11": 12 chunks, 12 words + 14 digits = 26 tokens.
    config = _probe(triton_rig, protocol, max_tokens=12, tokenizer=tokenizer_file)
    (result,) = _run(config, 1)
    assert result.ok, result.error_message
    assert len(result.gaps_s) == 11
    assert result.tokens == 26
