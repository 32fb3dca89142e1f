"""Command-line options made from config dataclasses, and the configs made back from the options given.

Every field is an option `--field-name` (a nested config's fields too: TrainConfig.model's n_layer is `--n-layer`),
typed as the field is: int, float or str; a Literal or an Enum, whose values are its choices; a bool, as `--name` and
`--no-name`; any of these `| None`. Its help is the comment beside the field, and the config's default. An option
left out parses as None, so `given` knows what the command line asked for and `config_from` lays just that over a
config: the defaults, a preset, or a resumed run's settings.

One command may take the options of several configs (`ttlib train`: the Trajectory GPT's, the Decision
Transformer's, the baselines'): a field they share is one option, and its help says whose default is what.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import re
import types
import typing
from dataclasses import fields, is_dataclass, replace

__all__ = ["add_config_options", "config_from", "given", "given_options", "leaves", "option"]

_FIELD = re.compile(r"^    (\w+)\s*:[^#]*#\s?(.*)$")  # `    name: type = default  # comment`, in a class body
_MORE = re.compile(r"^\s+#\s*(.*)$")  # a comment line that goes on with the field above


def leaves(config) -> dict:
    """{name: (value, type hint, class)} of every field, a nested config's fields in its place."""
    out, hints = {}, typing.get_type_hints(type(config))
    for f in fields(config):
        value = getattr(config, f.name)
        out.update(leaves(value) if is_dataclass(value) else {f.name: (value, hints[f.name], type(config))})
    return out


def option(name: str, names: dict | None = None) -> str:
    """The option a field is given with: `--field-name`, or the first of its `names`."""
    return (names or {}).get(name, ("--" + name.replace("_", "-"),))[0]


def _dest(name: str, names: dict | None) -> str:
    return option(name, names)[2:].replace("-", "_")


def _comments(cls) -> dict[str, str]:
    """The comment beside each field of a dataclass (its base classes' too), continuation lines joined."""
    found: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if is_dataclass(k)]):
        name = None
        for line in inspect.getsource(klass).splitlines():
            field, more = _FIELD.match(line), _MORE.match(line)
            if field:
                name, found[field[1]] = field[1], field[2].strip()
            elif more and name:
                found[name] += " " + more[1].strip()
            else:
                name = None
    return found


def _argument(hint, where: str) -> dict:
    """add_argument's type, choices or action for a field's type hint (`where`: Class.field, for the error)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    kind = kinds[0] if len(kinds) == 1 else None
    if typing.get_origin(kind) is typing.Literal:
        choices = list(typing.get_args(kind))
        return {"type": type(choices[0]), "choices": choices}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"type": kind, "choices": list(kind), "metavar": "{" + ",".join(str(m.value) for m in kind) + "}"}
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if kind in (int, float, str):
        return {"type": kind}
    raise TypeError(f"{where}: no command-line option for a field of type {hint} (skip it, or give it a type above)")


def add_config_options(parser, configs: dict, skip=(), names: dict | None = None, notes: dict | None = None) -> None:
    """An option for every field of the configs (instances: their values are the defaults the help states), e.g.
    {"tt": TrainConfig(), "dt": DTTrainConfig()}; a field of only some says whose it is. `skip`: fields that are
    not options (the data decide them, or another option does); `names`: a field's option strings when not
    `--field-name` (the first is its name, the rest aliases: old spellings); `notes`: words said before its default,
    or in its place when they start with "default"."""
    shared: dict[str, list] = {}
    for who, config in configs.items():
        for name, (value, hint, cls) in leaves(config).items():
            if name not in skip:
                shared.setdefault(name, []).append((who, value, hint, cls))
    for name, owners in shared.items():
        _, _, hint, cls = owners[0]
        shown = [(who, v.value if isinstance(v, enum.Enum) else v) for who, v, _, _ in owners]
        default = f"default {shown[0][1]}" if len({str(v) for _, v in shown}) == 1 else \
            "default " + ", ".join(f"{v} ({who})" for who, v in shown)
        whose = f"for {'/'.join(who for who, *_ in owners)}; " if len(owners) < len(configs) else ""
        note = (notes or {}).get(name, "")
        default = note if note.startswith("default") else " ".join(filter(None, (note, default)))
        parser.add_argument(*(names or {}).get(name, (option(name),)), dest=_dest(name, names), default=None,
                            help=f"{_comments(cls).get(name, '')} ({whose}{default})".replace("%", "%%"),
                            **_argument(hint, f"{cls.__name__}.{name}"))


def given(args, config, names: dict | None = None) -> dict:
    """{field: value} of the config's fields (a nested config's among them) given on the command line."""
    values = {name: getattr(args, _dest(name, names), None) for name in leaves(config)}
    return {name: value for name, value in values.items() if value is not None}


def given_options(args, configs, names: dict | None = None) -> set[str]:
    """The options given on the command line that set a field of any of `configs`."""
    return {option(name, names) for config in configs for name in given(args, config, names)}


def config_from(args, config, names: dict | None = None):
    """`config` with the options given on the command line laid over it, nested configs included."""
    values, changes = given(args, config, names), {}
    for f in fields(config):
        inner = getattr(config, f.name)
        if is_dataclass(inner):
            changes[f.name] = config_from(args, inner, names)
        elif f.name in values:
            changes[f.name] = values[f.name]
    return replace(config, **changes)
