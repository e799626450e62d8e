"""Control: the commands a run receives, checked, handed to every rank and acknowledged.

- :mod:`~rlpulse.producers.control.client`: ``ControlClient``: the run's commands, acked;
- :mod:`~rlpulse.producers.control.screening`: the trainer's check of a command's contents;
- :mod:`~rlpulse.producers.control.bus`: ``CommandBus``, rank 0's commands on every rank.
"""
