"""``tritonwatch check-rules``, ``rules-schema`` and ``import-slo``: the rules file's commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def check_rules(path: str) -> int:
    """Validate ``path``; print every error with its key path (exit 2) or a summary (exit 0).

    Tiers that can never fire at an SLO's objective are printed as warnings.
    """
    from tritonwatch.alerts.slo import Slo
    from tritonwatch.schemas.config import ConfigError
    from tritonwatch.schemas.rules import load_rules_file

    try:
        rules = load_rules_file(path)
    except ConfigError as exc:
        _err(f"{exc.source}: {len(exc.errors)} error(s)")
        for line in exc.errors:
            _err(f"  {line}")
        return 2  # a bad input file, as for every command (tritonwatch.cli)
    for i, spec in enumerate(rules.slos):
        for warning in Slo.from_spec(spec).warnings:
            _err(f"{path}: warning: slos[{i}]: {warning}")
    defaults = "on" if rules.defaults.enabled else "off"
    _out(f"{path}: OK ({len(rules.slos)} SLO(s), {len(rules.alerts)} threshold rule(s), "
         f"{len(rules.regressions)} regression rule(s), built-in defaults {defaults})")
    return 0


def rules_schema() -> int:
    """Print the rules file's JSON Schema."""
    from tritonwatch.schemas.rules import rules_json_schema

    _out(json.dumps(rules_json_schema(), indent=2))
    return 0


def import_slo(path: str, *, window: str = "30d") -> int:
    """Translate a Sloth or OpenSLO file into our rules YAML on stdout (notes on stderr)."""
    from tritonwatch.alerts.importers import import_slo_file, to_yaml
    from tritonwatch.schemas.config import ConfigError

    try:
        imported = import_slo_file(path, window=window)
    except ConfigError as exc:
        _err(f"{exc.source}: {len(exc.errors)} error(s)")
        for line in exc.errors:
            _err(f"  {line}")
        return 2  # a bad input file, as for every command (tritonwatch.cli)
    for note in imported.notes:
        _err(f"{path}: note: {note}")
    sys.stdout.write(to_yaml(imported.slos))
    return 0


def add_commands(sub: Any) -> None:
    """Register the three sub-commands on ``build_parser``'s sub-parsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "check-rules", help="validate a rules file, print every error with its key path")
    p.add_argument("file")
    p.set_defaults(func=lambda a: check_rules(a.file))

    p = sub.add_parser("rules-schema", help="print the rules file's JSON Schema")
    p.set_defaults(func=lambda a: rules_schema())

    p = sub.add_parser("import-slo", help="translate a Sloth or OpenSLO SLO spec to rules YAML")
    p.add_argument("file")
    p.add_argument("--window", choices=["28d", "30d"], default="30d",
                   help="SLO period for Sloth specs, which have none (default 30d)")
    p.set_defaults(func=lambda a: import_slo(a.file, window=a.window))
