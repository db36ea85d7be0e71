"""Run as one multi-worker worker: the trainer on 2 workers x 1 replica, weights saved.

`python -m tests.distribute.multiworker_script OUT.npz MODEL_DIR [--epochs N]
[--kill_at_epoch K] [--resume]` reads TF_CONFIG (set by the test) and trains through the
trainer and the multi-worker runtime: each worker reads its own shard, each replica
accumulates 2 micro-batches of 4 (global batch 16 = 4 x 2 x 2, as the one-device reference's
16), and the project's loop runs the steps (Keras 3 `fit` fails under
MultiWorkerMirroredStrategy, keras#20585). The one-device reference runs elsewhere.
"""

import argparse

from tests.distribute import trainer_runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("model_dir")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--kill_at_epoch", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    run = trainer_runs.train_run(args.model_dir, strategy="multiworker", replicas=2,
                                 micro_batch_size=4, gradient_accumulation=2,
                                 device_iterations=2, epochs=args.epochs, resume=args.resume,
                                 kill_at_epoch=args.kill_at_epoch)
    trainer_runs.save(args.out, run)


if __name__ == "__main__":
    main()
