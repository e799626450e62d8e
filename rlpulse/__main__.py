"""``python -m rlpulse`` runs the command line."""

from rlpulse.cli import main

main()
