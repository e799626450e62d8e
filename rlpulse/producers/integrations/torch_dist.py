"""The ``torch.distributed`` broadcast that hands rank 0's commands to every rank.

Pass :func:`torch_broadcast` as the ``broadcast`` of a :class:`~rlpulse.producers.RunLink`
in a torchrun job (the Hugging Face callback does). torch is imported on the first call,
never at import time.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def torch_broadcast(value: T, /) -> T:
    """Rank 0's ``value`` on every rank; ``value`` itself when no process group is initialised.

    With a default process group it is a collective: every rank calls it at the same
    point and ``torch.distributed.broadcast_object_list`` sends rank 0's object (what
    other ranks pass is ignored). With NCCL the object travels through the current CUDA
    device, so set it (``torch.cuda.set_device``) first, as every NCCL job does.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    box: list[object] = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]
