"""The shipped encodings load offline and tokenize exactly as tiktoken's own downloads do."""

import hashlib
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import tiktoken
from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

from proxy.engine.encodings import SHIPPED_ENCODINGS, get_encoding

BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
"""Where tiktoken downloads an encoding's rank file from; its cache names the file by this URL's sha1."""

SAMPLES = [
    "Hello, world! How are you today?",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé — 中文字符 — emojis 🎉🚀 — العربية",
    '{"path": "/var/log/app.log", "lines": [1, 2, 3], "ok": true}',
    "<|endoftext|> is treated as ordinary text",
]


@pytest.mark.parametrize("name", SHIPPED_ENCODINGS)
def test_shipped_encoding_matches_tiktoken(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # tiktoken's own constructor builds the reference: its pattern, its special tokens, and its pinned sha256 of the
    # rank file, checked against the file we ship, placed where tiktoken's cache would hold its download. A file that
    # failed the check would be downloaded again, which the dead proxy makes fail instead.
    url = BLOB_URL.format(name=name)
    shipped = resources.files("proxy.engine.encodings").joinpath(f"{name}.tiktoken").read_bytes()
    (tmp_path / hashlib.sha1(url.encode()).hexdigest()).write_bytes(shipped)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    reference = tiktoken.Encoding(**ENCODING_CONSTRUCTORS[name]())
    ours = get_encoding(name)
    assert (ours.n_vocab, ours.special_tokens_set) == (reference.n_vocab, reference.special_tokens_set)
    for text in SAMPLES:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text)
        assert ours.encode(text, allowed_special="all") == reference.encode(text, allowed_special="all")


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
