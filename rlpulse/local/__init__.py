"""Processes rlpulse runs on this machine: the local Kafka broker, worker children, the demo."""
