"""Command-line edge: absl flags are read here, and only here, into a frozen TrainConfig."""
