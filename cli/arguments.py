"""Command-line values checked while the command line is parsed: a malformed one is a usage error (exit 2).

As with Click and argparse, a value the command line cannot take (a malformed `NAME@N`, an
unknown role, an alias that could never be valid) exits 2 with the usage line, before any
registry is opened. Exit 14 stays for what the registry itself refuses (an alias on another
model's version, a duplicate). The rules are the registry's (registry.service, registry.tokens);
tests/cli/test_cli_conventions.py checks that both sides accept and refuse the same values.
"""

from __future__ import annotations

import re

import typer

#: A model or alias name, as registry.service accepts it.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit (at most 128 characters)"
#: An alias cannot look like a version number or shadow NAME@latest.
RESERVED_ALIASES = ("latest",)


def model_name(value: str | None) -> str | None:
    """A model name, or a usage error naming the rule."""
    if value is not None and not NAME.match(value):
        raise typer.BadParameter(f"'{value}' is not a model name; use {NAME_RULE}, e.g. resnet.")
    return value


def model_names(values: list[str] | None) -> list[str] | None:
    for value in values or ():
        model_name(value)
    return values


def version_ref(value: str | None) -> str | None:
    """NAME, NAME@N or NAME@ALIAS, or a usage error that shows the expected shape."""
    if value is None:
        return None
    name, at, suffix = value.rpartition("@")
    if not at:
        name, suffix = value, None
    if NAME.match(name) and (suffix is None or suffix.isdigit() or NAME.match(suffix)):
        return value
    raise typer.BadParameter(
        f"'{value}' is not a version reference; expected NAME, NAME@N or NAME@ALIAS (e.g. resnet@3 or resnet@production), "
        f"where NAME and ALIAS use {NAME_RULE}."
    )


def alias_name(value: str) -> str:
    """An alias that can be set: a name that is neither a number nor reserved."""
    if not NAME.match(value) or value.isdigit() or value in RESERVED_ALIASES:
        raise typer.BadParameter(
            f"'{value}' cannot be an alias; use {NAME_RULE}, not a number and not "
            f"{' or '.join(repr(r) for r in RESERVED_ALIASES)} (e.g. production)."
        )
    return value


def alias_names(values: list[str] | None) -> list[str] | None:
    for value in values or ():
        alias_name(value)
    return values


def token_role(value: str) -> str:
    """One of registry.tokens.ROLES."""
    from registry.tokens import ROLES

    if value not in ROLES:
        raise typer.BadParameter(f"'{value}' is not a role; choose {', '.join(ROLES[:-1])} or {ROLES[-1]}.")
    return value


def operation(value: str | None) -> str | None:
    """A lineage label of registry.service.registration.OPERATIONS."""
    if value is None:
        return None
    from registry.service.registration import OPERATIONS

    if value not in OPERATIONS:
        raise typer.BadParameter(f"'{value}' is not a lineage operation; choose one of {', '.join(OPERATIONS)}.")
    return value


def frameworks(values: list[str] | None) -> list[str] | None:
    """Framework names of converters.REGISTRY (`check --framework`); an unknown one is a usage error,
    not a failed check."""
    if not values:
        return values
    from converters import REGISTRY

    known = REGISTRY.framework_names
    for value in values:
        if value not in known:
            raise typer.BadParameter(f"'{value}' is not a framework; choose {', '.join(known[:-1])} or {known[-1]}.")
    return values


def conversion_opset(value: int) -> int:
    """An opset the layer converters can write (converters.options.MIN_OPSET and up)."""
    from converters.options import MIN_OPSET

    if value < MIN_OPSET:
        raise typer.BadParameter(
            f"{value} is below opset {MIN_OPSET}, the lowest normbridge converts a layer to; pass --opset {MIN_OPSET} or higher."
        )
    return value


def token_roles() -> list[str]:
    """Shell completion of --role."""
    from registry.tokens import ROLES

    return list(ROLES)


__all__ = [
    "NAME",
    "alias_name",
    "alias_names",
    "conversion_opset",
    "frameworks",
    "model_name",
    "model_names",
    "operation",
    "token_role",
    "token_roles",
    "version_ref",
]
