"""Environments by name (built-ins) or by dotted path (`my_pkg.envs:MyEnv`), the way slime
and verl users plug theirs in."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from venusrl.env.base import Environment

_BUILTIN = {
    "calculator": "venusrl.env.calculator:CalculatorEnv",
    "python": "venusrl.env.python_exec:PythonEnv",
    "swe-lite": "venusrl.env.swe_lite:SweLiteEnv",
    "swe-image": "venusrl.env.swe_image:SweImageEnv",
}


def load_object(path: str) -> object:
    """`package.module:attribute`; errors name what could not be found."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r}: expected 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{path!r}: cannot import {module_name} ({err})") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{path!r}: {module_name} has no attribute {attribute!r}") from None


def environment_factory(name: str) -> Callable[[], Environment]:
    """A callable making one environment per trajectory."""
    path = _BUILTIN.get(name, name)
    if ":" not in path:
        raise ValueError(f"unknown environment {name!r}: use one of {', '.join(_BUILTIN)} or 'package.module:Class'")
    target = load_object(path)
    if not (isinstance(target, type) and issubclass(target, Environment)):
        raise ValueError(f"{name!r} is not a venusrl.env.base.Environment subclass")
    return target


def dataset_generator(name: str) -> Callable[..., list[dict[str, Any]]]:
    """`generate_dataset(count, seed, **options)` of an environment: the built-ins' module
    function, or a custom environment class's `generate_dataset` attribute."""
    path = _BUILTIN.get(name, name)
    if name in _BUILTIN:
        return load_object(f"{path.partition(':')[0]}:generate_dataset")
    generator = getattr(environment_factory(name), "generate_dataset", None)
    if generator is None:
        raise ValueError(f"environment {name!r} has no generate_dataset; set data.train and data.eval to JSONL files")
    return generator
