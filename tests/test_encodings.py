"""The shipped encodings load offline and tokenize exactly as tiktoken's own downloads do."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken

from proxy.engine.encodings import SHIPPED_ENCODINGS, get_encoding

SHARED_TIKTOKEN = Path(__file__).resolve().parents[2] / "shared" / "tiktoken"

SAMPLES = [
    "Hello, world! How are you today?",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé — 中文字符 — emojis 🎉🚀 — العربية",
    '{"path": "/var/log/app.log", "lines": [1, 2, 3], "ok": true}',
    "<|endoftext|> is treated as ordinary text",
]


@pytest.mark.parametrize("name", SHIPPED_ENCODINGS)
def test_shipped_encoding_matches_tiktoken(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not SHARED_TIKTOKEN.is_dir():
        pytest.skip("the reference copy of tiktoken's cache is not beside this checkout")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))
    reference = tiktoken.get_encoding(name)
    ours = get_encoding(name)
    for text in SAMPLES:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text)


def test_unknown_encoding_is_refused() -> None:
    with pytest.raises(ValueError, match="ships"):
        get_encoding("r50k_base")


def test_loads_without_tiktokens_cache_or_network(tmp_path: Path) -> None:
    # tiktoken's own loader would look in this empty cache and then try to download; ours must need neither.
    code = (
        "from proxy.engine.encodings import get_encoding; "
        "print(len(get_encoding('cl100k_base').encode_ordinary('hello world')))"
    )
    env = {
        **os.environ,
        "TIKTOKEN_CACHE_DIR": str(tmp_path),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "2"
    assert not any(tmp_path.iterdir()), "nothing was written to tiktoken's cache"
