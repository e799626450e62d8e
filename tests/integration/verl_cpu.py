"""Test harness only: the minimal patches that let verl 0.9.1's worker code run on a CPU.

verl loads this module the way it loads rlpulse's plugin (``VERL_USE_EXTERNAL_MODULES``,
listed first), so every process of a test run gets the same three patches, and nothing
else of verl is replaced:

1. a ``cpu`` platform in verl's ``PlatformRegistry`` (select it with ``VERL_PLATFORM=cpu``):
   verl 0.9.1 registers only accelerators and falls back to ``cuda`` without one;
2. its device module is :mod:`torch.cpu` with the memory functions verl's workers call
   (``max_memory_allocated``... in ``engine_workers.py`` ~219) answering 0;
3. verl's value-model loader (``utils/model.py`` ~649) hard-codes flash-attention, which
   has no CPU kernel: it is called with ``attn_implementation="eager"`` instead;
4. ``apply_monkey_patch`` (``models/transformers/monkey_patch.py`` ~352) imports trl's
   ``AutoModelForCausalLMWithValueHead`` whenever trl is installed; the trl installed for
   the Hugging Face tests (1.16) no longer has it, so that module is told trl is absent
   (only trl value-head models, which these tests do not build, would need it).
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


class _CpuDevice(ModuleType):
    """``torch.cpu`` plus the CUDA-style memory and RNG functions verl calls (no-ops)."""

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if "memory" in name or name.startswith("max_"):
            return _zero
        if name == "mem_get_info":
            return lambda *_a, **_k: (0, 0)
        if name == "memory_stats":
            return lambda *_a, **_k: {}
        if name == "get_device_name":
            return lambda *_a, **_k: "CPU"
        return _nothing


CPU_DEVICE = _CpuDevice("torch_cpu_for_verl")


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):  # type: ignore[misc]
    """verl on the CPU: device ``cpu``, collectives over gloo."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        # verl moves tensors to ``get_device_id()``: an index would mean cuda:<index>.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {}

    def get_collective_module(self) -> Any:
        return None

    def cudart(self) -> Any:
        return SimpleNamespace()


def _eager_value_model_loader() -> None:
    from transformers import AutoModelForTokenClassification
    from verl.utils import model as verl_model

    original = verl_model.load_valuehead_model
    if getattr(original, "_eager", False):
        return

    @functools.wraps(original)
    def load_valuehead_model(
        local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool
    ) -> Any:
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation="eager",
            trust_remote_code=trust_remote_code,
        )

    load_valuehead_model._eager = True  # type: ignore[attr-defined]
    verl_model.load_valuehead_model = load_valuehead_model


def _no_trl_value_head() -> None:
    from verl.models.transformers import monkey_patch

    monkey_patch.is_trl_available = lambda: False


_eager_value_model_loader()
_no_trl_value_head()
