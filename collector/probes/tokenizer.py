"""Counting output tokens with a locally available tokenizer (``probes[].tokenizer``).

Streamed chunks are not always tokens (an OpenAI-compatible server may batch several tokens
into one chunk, a detokenizer may hold one back), so a probe can count the output text with the
model's own tokenizer, as GenAI-Perf does.  The tokenizer must be a local ``tokenizer.json``
(Hugging Face ``tokenizers`` format): nothing is downloaded.  When it is not available (no file,
or the optional ``tokenizers`` package is missing) the probe says so once and counts chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def load_token_counter(path: str | None, probe: str) -> Callable[[str], int] | None:
    """A function counting the tokens of a text, or None (count streamed chunks instead)."""
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log.warning("probe %s: the tokenizers package is not installed; counting streamed "
                    "chunks as tokens (pip install tokenizers)", probe)
        return None
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        log.warning("probe %s: tokenizer %s unavailable (%s); counting streamed chunks as tokens",
                    probe, path, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
