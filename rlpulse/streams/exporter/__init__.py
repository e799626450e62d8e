"""``rlpulse exporter``: what the run is doing, as Prometheus metrics, and rule commands as alerts.

:mod:`~rlpulse.streams.exporter.state` (pure: latest values, names, caps, expiry) is what it
serves; :mod:`~rlpulse.streams.exporter.collector` renders it for prometheus-client;
:mod:`~rlpulse.streams.exporter.consumer` reads the topics from a lookback;
:mod:`~rlpulse.streams.exporter.lag` measures consumer lag;
:mod:`~rlpulse.streams.exporter.alerts` forwards commands to Alertmanager;
:mod:`~rlpulse.streams.exporter.server` wires them into the long-running process.
"""
