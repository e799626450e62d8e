"""Importing this module makes verl's ``Tracking`` accept the ``rlpulse`` backend.

It exists to be imported by verl itself, in every process that imports verl: verl's
``__init__`` imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` (the launcher
``python -m rlpulse.producers.integrations.verl`` adds this one, and the Ray workers verl
starts inherit the variable) and loads its ``verl.plugins`` entry points. Importing it
has that one effect, :func:`~rlpulse.producers.integrations.verl.install`.
"""

from rlpulse.producers.integrations.verl import install

install()
