"""Run as `horovodrun -np 2 python -m tests.distribute.horovod_trainer_script OUT`: the trainer
with --strategy=horovod; rank 0 also the reference.

Each rank reads its shard and accumulates 2 micro-batches of 4 per update (global batch 16 =
4 x 2 x 2) and saves its final weights to OUT/rank<r>.npz; rank 0 then trains the same config
with Keras' `fit` on one device (batches of 16) into OUT/single.npz.
"""

import os
import sys

import horovod.tensorflow as hvd

from tests.distribute import trainer_runs


def main(out: str) -> None:
    hvd.init()
    rank = hvd.rank()
    run = trainer_runs.train_run(os.path.join(out, f"run{rank}"), strategy="horovod",
                                 replicas=2, micro_batch_size=4, gradient_accumulation=2,
                                 device_iterations=2)
    trainer_runs.save(os.path.join(out, f"rank{rank}.npz"), run)
    if rank == 0:
        reference = trainer_runs.train_run(os.path.join(out, "single"), one_device=True)
        trainer_runs.save(os.path.join(out, "single.npz"), reference)


if __name__ == "__main__":
    main(sys.argv[1])
