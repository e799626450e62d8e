"""Importing this module installs rlpulse in a verl process: the backend and the rank hooks.

It exists to be imported by verl itself, in every process that imports verl: verl's
``__init__`` imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` (the launcher
``python -m rlpulse.producers.integrations.verl`` adds this one, and the Ray workers verl
starts inherit the variable) and loads its ``verl.plugins`` entry points. Importing it
has two effects: :func:`~rlpulse.producers.integrations.verl.install` (the ``rlpulse``
``Tracking`` backend) and :func:`~rlpulse.producers.integrations.verl_workers.install`
(each data-parallel rank's metrics and every process's log records, see that module).
verl swallows an entry point's exceptions at DEBUG level, so a failure here is logged at
WARNING and training goes on without rlpulse's part that failed.
"""

import logging

_log = logging.getLogger(__name__)

try:
    from rlpulse.producers.integrations import verl, verl_workers

    verl.install()
    verl_workers.install()
except Exception:
    _log.warning("rlpulse's verl plugin failed to install; verl runs without it", exc_info=True)
