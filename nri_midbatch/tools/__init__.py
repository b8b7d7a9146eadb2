"""What an operator runs: the command line, replay, explain, the webhook."""
