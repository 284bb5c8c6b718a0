"""The proxy's settings: one validated pydantic model, loaded from flags, environment, a config file and defaults.

`Settings` is composed from one group of fields per concern (`upstream`, `clients`, `compaction`, `summaries`,
`state`); `loading` merges the sources. This package imports neither aiohttp nor the engine: the compaction side
and the CLI can both read settings cheaply.
"""

from proxy.config.compaction import DEFAULT_STRATEGIES
from proxy.config.kinds import MIB, ClientCompaction, LogFormat, LogLevel, Mode, ProviderState
from proxy.config.loading import CONFIG_ENV, ENV_PREFIX, ConfigError, env_name, load_settings, read_config_file
from proxy.config.settings import FIELDS, Settings
from proxy.config.state import CREDENTIAL_HEADERS

__all__ = [
    "CONFIG_ENV",
    "CREDENTIAL_HEADERS",
    "DEFAULT_STRATEGIES",
    "ENV_PREFIX",
    "FIELDS",
    "MIB",
    "ClientCompaction",
    "ConfigError",
    "LogFormat",
    "LogLevel",
    "Mode",
    "ProviderState",
    "Settings",
    "env_name",
    "load_settings",
    "read_config_file",
]
