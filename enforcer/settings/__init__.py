"""Settings: the ADL_ENFORCER_* environment variables (and adl-enforcerd's TOML file).

- model.py: the one model (pydantic-settings) embedded adl-exec and adl-enforcerd both load;
  adl-enforcerd's own settings extend it (enforcer/daemon/config.py).
- launch.py: the plain settings of an embedded launch, read under the same names without
  importing pydantic (which a launch pays for only when it needs the egress filter's settings).

The commands (enforcer/cli) read the environment and pass values down; nothing below them reads
os.environ (tests/unit/test_settings.py).
"""
