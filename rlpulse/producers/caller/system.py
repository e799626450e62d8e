"""Per-rank system metrics: a rank's process CPU, memory and GPU, sampled off the training thread.

With ``producer.system_metrics_interval_s`` set, every :class:`~rlpulse.producers.RunLink`
runs a :class:`SystemSampler`: a daemon thread that every interval logs one event in stage
``system`` with

- ``process_cpu_seconds_total``: CPU time (user + system) of the process so far;
- ``process_resident_memory_bytes``: its resident set size (Linux ``/proc``; absent elsewhere);
- ``gpu_utilization_ratio`` and ``gpu_memory_used_bytes`` of the rank's GPU, when ``pynvml``
  (the ``nvidia-ml-py`` package) imports and finds one.

The exporter serves them as ``<namespace>_<name>{run,stage="system",rank}``. The ``step`` of a
system event is the sample's index (0, 1, 2, ...), not the training step: samples are taken in
time, and the worker joins the ranks' n-th samples into one summary without revisions. So the
samples leave the logger's ``last_step`` alone: the step of a text record logged without one,
and of the ``run_end`` a link sends at close, is the last step the trainer logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Final

from rlpulse.producers.caller.logger import EventLogger
from rlpulse.producers.encoding.fields import EventFields
from rlpulse.producers.exceptions import ProducerClosedError
from rlpulse.schemas.records import SYSTEM_STAGE

__all__ = ["SYSTEM_STAGE", "GpuProbe", "SystemSampler", "sample_process"]

log = logging.getLogger(__name__)

_STATM: Final = "/proc/self/statm"


def sample_process() -> dict[str, float]:
    """The calling process's CPU seconds and (where ``/proc`` exists) resident memory in bytes."""
    sample = {"process_cpu_seconds_total": time.process_time()}
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(_STATM) as statm:
            resident_pages = int(statm.read().split()[1])
        sample["process_resident_memory_bytes"] = float(resident_pages * os.sysconf("SC_PAGE_SIZE"))
    return sample


class GpuProbe:
    """The rank's GPU through NVML: the device ``LOCAL_RANK`` picks among ``CUDA_VISIBLE_DEVICES``.

    :meth:`sample` returns nothing when ``pynvml`` is not installed or finds no such device.
    """

    def __init__(self) -> None:
        self._handle: Any = None
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._handle = _device_handle(pynvml)
            self._nvml = pynvml
        except Exception as exc:  # ImportError, or NVML's own errors without a GPU
            log.debug("no GPU metrics: %s", exc)

    def sample(self) -> dict[str, float]:
        """GPU utilisation (0..1) and memory in use (bytes), or {}."""
        if self._nvml is None:
            return {}
        try:
            utilization = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as exc:  # a GPU that went away must not stop the sampler
            log.debug("GPU sample failed: %s", exc)
            return {}
        return {
            "gpu_utilization_ratio": utilization.gpu / 100.0,
            "gpu_memory_used_bytes": float(memory.used),
        }


def _device_handle(pynvml: Any) -> Any:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    visible = [
        d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()
    ]
    device = visible[local_rank] if local_rank < len(visible) else str(local_rank)
    if device.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(device))
    return pynvml.nvmlDeviceGetHandleByUUID(device)


class SystemSampler:
    """Logs :func:`sample_process` and the GPU probe's sample every ``interval_s`` to ``events``.

    :meth:`start` starts the daemon thread (again: nothing); :meth:`stop` ends it. Transport
    trouble is the event logger's to handle (it never raises for it); a closed logger ends
    the thread.
    """

    def __init__(self, events: EventLogger, interval_s: float) -> None:
        self.events = events
        self.interval_s = interval_s
        self.samples = 0
        """Samples logged so far (the next one's step)."""
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start sampling, once (a second call, or one after :meth:`stop`, does nothing)."""
        with self._lock:
            if self._thread is not None or self._stopped.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name="rlpulse-system-metrics", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling and wait for the thread."""
        self._stopped.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        gpu = GpuProbe()
        while not self._stopped.is_set():
            sample = EventFields(
                "metrics", self.samples, SYSTEM_STAGE, None, {**sample_process(), **gpu.sample()}
            )
            try:
                self.events.log_event(sample, training_step=False)
            except ProducerClosedError:
                return
            self.samples += 1
            self._stopped.wait(self.interval_s)
