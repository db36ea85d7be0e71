"""Run under `horovodrun -np 2`: the trainer with --backend=horovod; rank 0 also the reference.

Each rank saves its final weights to OUT/rank<r>.npz; rank 0 then trains the same config with
Keras' `fit` on one device (same global batch of 16) into OUT/single.npz.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import horovod.tensorflow as hvd  # noqa: E402
import trainer_runs  # noqa: E402


def main(out: str) -> None:
    hvd.init()
    rank = hvd.rank()
    run = trainer_runs.train_run(os.path.join(out, f"run{rank}"), backend="horovod",
                                 replicas=2, micro_batch_size=8, device_iterations=2)
    trainer_runs.save(os.path.join(out, f"rank{rank}.npz"), run)
    if rank == 0:
        reference = trainer_runs.train_run(os.path.join(out, "single"), one_device=True)
        trainer_runs.save(os.path.join(out, "single.npz"), reference)


if __name__ == "__main__":
    main(sys.argv[1])
