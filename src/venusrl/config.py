"""One config schema for the whole system, loaded from YAML with dotted overrides.

Each component owns its section (a `venusrl.schema.Section` next to its code); this module
composes them into `Config` and turns every malformed input into a `ConfigError` that names
the key path, what was expected and what was given.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from venusrl.coordinator.config import CoordinatorConfig, PredictorConfig
from venusrl.demo_config import DemoConfig
from venusrl.engine.config import EngineConfig
from venusrl.metrics.config import MetricsConfig
from venusrl.rollout.config import RolloutConfig
from venusrl.runtime.config import DataConfig, SchedulerConfig
from venusrl.sandbox.config import SandboxConfig
from venusrl.schema import Section
from venusrl.trainer.config import TrainerConfig


class ConfigError(ValueError):
    """A config problem, always naming the key path (or file and line) it is about."""


class ModelConfig(Section):
    path: str | None = Field(None, description="Hugging Face model directory")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("cpu", description="torch device of the policy model")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the chat template, e.g. {enable_thinking: false} (Qwen3)")
    tool_call_format: Literal["auto", "hermes", "qwen3_coder", "llama3_json"] = Field(
        "auto", description="how the model writes tool calls; auto: the one its chat template shows")


class RunConfig(Section):
    name: str = "venusrl"
    seed: int = 0
    run_dir: str | None = Field(None, description="default: runs/NAME-TIMESTAMP")
    runtime: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="Ray cluster to join (runtime: ray); default: start one on this machine")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class Config(Section):
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    predictor: PredictorConfig = PredictorConfig()
    run: RunConfig = RunConfig()
    sandbox: SandboxConfig = SandboxConfig()
    rollout: RolloutConfig = RolloutConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    trainer: TrainerConfig = TrainerConfig()
    data: DataConfig = DataConfig()
    metrics: MetricsConfig = MetricsConfig()
    demo: DemoConfig = DemoConfig()

    @model_validator(mode="after")
    def _derive(self) -> Config:
        """The coordinator ranks groups with the rule the scheduler section names (one place
        says it); a baseline left at the default rule shows the one it runs (none), so a dumped
        config loads again. Each assignment re-runs this validator once, with nothing left to
        change."""
        scheduler = self.scheduler
        if "priority" not in scheduler.model_fields_set and scheduler.priority != scheduler.ranking:
            self.scheduler = scheduler.model_copy(update={"priority": scheduler.ranking})
        if self.coordinator.policy != self.scheduler.ranking:
            self.coordinator = self.coordinator.model_copy(update={"policy": self.scheduler.ranking})
        # venus's worker hands a stalled LOW holder's slot to the urgent turns behind it
        # (`RolloutCore._serve_urgent`, demotions refreshed), so its engines keep HIGH KV
        conserve = not (self.scheduler.policy == "venus" and self.scheduler.ranking != "action_level")
        if "work_conservation" not in self.engine.model_fields_set and self.engine.work_conservation != conserve:
            self.engine = self.engine.model_copy(update={"work_conservation": conserve})
            self.engine.model_fields_set.discard("work_conservation")
        return self


# Keys that moved: a config that still sets one gets an error naming its replacement.
MOVED_KEYS = {
    "coordinator.policy": "scheduler.priority (the rule venus ranks groups with; scheduler.policy says the "
                          "slot mode, and the coordinator's rule is derived from both)",
}


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or start from defaults), apply `a.b.c=value` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(data, key, value)
    return validate_config(data)


def config_from(settings: Mapping[str, Any]) -> Config:
    """The defaults with `settings` ({"engine.page_size": 32, ...}: dotted keys to values) applied."""
    data: dict[str, Any] = {}
    for key, value in settings.items():
        _set_dotted(data, key, value)
    return validate_config(data)


def validate_config(data: dict[str, Any]) -> Config:
    for key, replacement in MOVED_KEYS.items():
        if _has_dotted(data, key):
            raise ConfigError(f"{key}: no longer a config key; set {replacement}")
    try:
        config = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError("invalid config:\n" + "\n".join(_describe(e) for e in err.errors())) from None
    scheduler = config.scheduler
    if "priority" in scheduler.model_fields_set and scheduler.ranking != scheduler.priority:
        raise ConfigError(f"scheduler.priority: {scheduler.priority!r} ranks groups for venus's priority slots, "
                          f"but scheduler.policy {scheduler.policy!r} ranks none; unset scheduler.priority "
                          "or set scheduler.policy: venus")
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """`engine.page_size=32` -> ("engine.page_size", 32); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: expected KEY.PATH=VALUE")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({err})") from None
    return key, value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config ({err.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        detail = str(getattr(err, "problem", err))
        context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and context_mark:
            detail += f"; {context} at line {context_mark.line + 1}"
        raise ConfigError(f"{where}: invalid YAML ({detail})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _has_dotted(data: dict[str, Any], key: str) -> bool:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _describe(error: dict[str, Any]) -> str:
    path = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        known = _known_keys(error["loc"][:-1])
        return f"  {path}: unknown key (known here: {', '.join(known)})"
    if error["type"] == "value_error":  # a section's own check across its fields: its message says it all
        return f"  {path}: {error['msg'].removeprefix('Value error, ')}"
    expected = _expected_type(error["loc"])
    given = error.get("input")
    return f"  {path}: {error['msg']} (expected {expected}, got {given!r})"


def _field_at(loc: tuple) -> Any:
    """The annotation at a key path of Config, or None where the path leaves the schema."""
    annotation: Any = Config
    for part in loc:
        model = _model_in(annotation)
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
    return annotation


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _known_keys(loc: tuple) -> list[str]:
    model = _model_in(_field_at(loc))
    return sorted(model.model_fields) if model else []


def _expected_type(loc: tuple) -> str:
    annotation = _field_at(loc)
    if annotation is None:
        return "a value"
    return _type_name(annotation)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"a mapping ({annotation.__name__})"
    return getattr(annotation, "__name__", str(annotation))
