"""rlpulse's settings for every verl process on every node, through Ray's runtime env.

verl starts Ray with the runtime env of ``verl.trainer.constants_ppo.get_ppo_ray_runtime_env``
(verl 0.9.1), a fixed list of verl's own variables. A Ray worker on the driver's node inherits the
driver's environment, one on another node does not: without more, ``RLPULSE_*``, the trace context
and ``VERL_USE_EXTERNAL_MODULES`` (which loads rlpulse's plugin) would not reach it.
:func:`install` wraps that function so that its ``env_vars`` also hold :func:`worker_env`: the
driver's ``RLPULSE_*`` variables, the ``rlpulse`` block of verl's config as ``RLPULSE_*``
variables, one trace context for the whole run, and the plugin. Ray applies a job's
runtime env on every node.

Secrets are never values in the runtime env (Ray shows it in its dashboard and logs): a SASL
password or signing key set in the driver's environment stays there, and a warning says to give
the workers a ``security.password_file`` / ``security.control_signing_key_file`` (paths, forwarded)
or set the variable on every node.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from rlpulse.producers.caller.trace import TRACE_ENV, new_trace_id, parse_trace_context
from rlpulse.settings import ENV_PREFIX, Settings

__all__ = ["PLUGIN_MODULE", "install", "with_plugin", "worker_env"]

log = logging.getLogger(__name__)

PLUGIN_MODULE: Final = "rlpulse.producers.integrations.verl_plugin"
"""The module verl imports in every process to load rlpulse (``VERL_USE_EXTERNAL_MODULES``)."""
EXTERNAL_MODULES_ENV: Final = "VERL_USE_EXTERNAL_MODULES"
_CONFIG_BLOCK: Final = "rlpulse"


def with_plugin(modules: str) -> str:
    """``VERL_USE_EXTERNAL_MODULES`` with :data:`PLUGIN_MODULE` added (once)."""
    names = [name for name in modules.split(",") if name.strip()]
    if PLUGIN_MODULE not in names:
        names.append(PLUGIN_MODULE)
    return ",".join(names)


def _secret_env_names() -> frozenset[str]:
    return frozenset(
        ENV_PREFIX + name.upper().replace(".", "__") for name in Settings.secret_fields
    )


def _as_env(tree: Mapping[str, Any], prefix: str = ENV_PREFIX) -> dict[str, str]:
    """``{"producer": {"linger_ms": 20}}`` -> ``{"RLPULSE_PRODUCER__LINGER_MS": "20"}``."""
    env: dict[str, str] = {}
    for key, value in tree.items():
        if value is None:
            continue
        name = f"{prefix}{key.upper()}"
        if isinstance(value, Mapping) and key != "librdkafka":
            env.update(_as_env(value, f"{name}__"))
        elif isinstance(value, Mapping | list | tuple):
            env[name] = json.dumps(value)
        else:
            env[name] = str(value)
    return env


def _plain(value: Any) -> Any:
    """An OmegaConf node (or anything mapping-like) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def worker_env(
    config: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables every verl process needs to publish to the same run as the driver.

    ``config`` is verl's (Hydra) config; its ``rlpulse`` block (``bootstrap``, ``prefix``,
    ``settings``) wins over the driver's environment ``environ`` (default ``os.environ``). The
    run id and step reach the workers with each batch (:mod:`.verl_workers`). The trace context
    is the driver's, or a new one (then also set in ``os.environ``, so the driver uses it too).
    """
    environ = os.environ if environ is None else environ
    secrets = _secret_env_names()
    env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX) and k not in secrets}
    block = _plain((config or {}).get(_CONFIG_BLOCK) or {})
    env.update(_as_env({k: v for k, v in block.get("settings", {}).items() if v is not None}))
    for key in ("bootstrap", "prefix"):
        if block.get(key) is not None:
            env[f"{ENV_PREFIX}{key.upper()}"] = str(block[key])
    trace = parse_trace_context(environ.get(TRACE_ENV, ""))
    if trace is None:
        trace = new_trace_id()
        if environ is os.environ:
            os.environ[TRACE_ENV] = trace
    env[TRACE_ENV] = trace
    env[EXTERNAL_MODULES_ENV] = with_plugin(environ.get(EXTERNAL_MODULES_ENV, ""))
    held_back = sorted(name for name in secrets if name in environ)
    if held_back:
        log.warning(
            "rlpulse: %s not forwarded to verl's Ray workers (no secret goes into Ray's runtime "
            "env): workers on other nodes need it set there, or a *_file setting naming a file "
            "they can read",
            ", ".join(held_back),
        )
    return env


def _with_rlpulse(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def get_ppo_ray_runtime_env(config: Any = None) -> dict[str, Any]:
        runtime_env = original(config)
        runtime_env.setdefault("env_vars", {}).update(worker_env(config))
        return runtime_env

    get_ppo_ray_runtime_env.__wrapped__ = original  # type: ignore[attr-defined]
    get_ppo_ray_runtime_env.__doc__ = original.__doc__
    return get_ppo_ray_runtime_env


def install() -> None:
    """Make verl's Ray runtime env carry :func:`worker_env`; idempotent.

    Patches ``verl.trainer.constants_ppo.get_ppo_ray_runtime_env`` and, when
    ``verl.trainer.main_ppo`` (which imports it by name) is loaded already, its copy too.
    """
    from verl.trainer import constants_ppo

    current = constants_ppo.get_ppo_ray_runtime_env
    if not hasattr(current, "__wrapped__"):
        constants_ppo.get_ppo_ray_runtime_env = _with_rlpulse(current)
    main_ppo = sys.modules.get("verl.trainer.main_ppo")
    if main_ppo is not None and not hasattr(main_ppo.get_ppo_ray_runtime_env, "__wrapped__"):
        setattr(main_ppo, "get_ppo_ray_runtime_env", constants_ppo.get_ppo_ray_runtime_env)  # noqa: B010
