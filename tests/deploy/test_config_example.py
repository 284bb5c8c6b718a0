"""`deploy/config.example.yaml`, the commented example of the configuration file, stays valid and true: it loads as
the proxy loads a `--config` file, names every setting, and each value it shows is that setting's default."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from proxy.config import Settings, load_settings
from proxy.engine.strategies.registry import DEFAULT_CHAIN
from proxy.settings_flags import SECRET_FIELDS

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"


def test_the_example_loads_and_shows_every_setting_at_its_default() -> None:
    loaded = load_settings(environ={}, config_file=EXAMPLE)
    defaults = Settings()
    for name in Settings.model_fields:
        if name not in SECRET_FIELDS:
            assert getattr(loaded, name) == getattr(defaults, name), name


def test_the_example_names_every_setting_and_comments_out_the_secrets() -> None:
    text = EXAMPLE.read_text()
    keys = set(yaml.safe_load(text))
    assert keys == set(Settings.model_fields) - set(SECRET_FIELDS)
    commented = set(re.findall(r"^# ([a-z_]+): ", text, re.MULTILINE))
    assert set(SECRET_FIELDS) <= commented
    for name in keys:  # each setting is explained right above it
        assert re.search(rf"^# .*\n{name}:", text, re.MULTILINE), name


def test_the_shipped_manifests_run_the_default_chain() -> None:
    # The gateway's ConfigMap and the chart spell the chain out: they must not drop a step the default runs.
    deploy = EXAMPLE.parent
    configmap = yaml.safe_load((deploy / "kubernetes" / "gateway" / "configmap.yaml").read_text())
    values = yaml.safe_load((deploy / "helm" / "compaction-proxy" / "values.yaml").read_text())
    for config in (yaml.safe_load(configmap["data"]["config.yaml"]), values["config"]):
        assert tuple(config["strategies"]) == DEFAULT_CHAIN
