"""The commands, in one room: train, evaluate, predict, export and folder_to_tfrecord, with the
convention they share (`parser`), one `BadInput` and exit-status table (`errors`), and train's
absl flags, read here and only here into a frozen TrainConfig (`flags`, `help`)."""
