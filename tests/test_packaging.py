"""Packaging metadata a build backend accepts without deprecation warnings."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_expression_and_the_backend_understands_it() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # A `{ text = ... }` table is deprecated by setuptools (removal announced for 2027); PEP 639 wants an SPDX string.
    assert pyproject["project"]["license"] == "Apache-2.0"
    # setuptools reads an SPDX `project.license` from 77 on; older ones refuse the build.
    (requirement,) = [req for req in pyproject["build-system"]["requires"] if req.startswith("setuptools")]
    match = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", requirement)
    assert match is not None and int(match.group(1)) >= 77
