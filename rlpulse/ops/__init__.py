"""What an operator sends to a running deployment: commands to a run, a new rule set."""
