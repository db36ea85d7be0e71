"""Run as `horovodrun -np 2 python -m tests.distribute.horovod_stop_script OUT`: the stop vote
and resume of the trainer under --strategy=horovod.

Both ranks train 2 epochs of 4 updates (global batch 16 = micro-batches of 4 x 2 accumulated x 2
ranks; host calls of 2 steps) in one shared run directory. Rank 1 sends itself SIGTERM as the
second epoch's first host call begins; both must stop after the same step, where rank 0 (alone)
writes the checkpoint. Both then resume in the same directory to the end. Each rank saves to
OUT/rank<r>.npz what it saw: the step, who it names as stopped by, the checkpoint and the final
weights; rank 0 then trains the same config uninterrupted with Keras' `fit` on one device into
OUT/single.npz.
"""

import os
import signal
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from keras_efficientnet.training.preemption import Preempted
from tests.distribute import trainer_runs

EPOCHS = dict(epochs=2, updates_per_epoch=4)


class SignalAtSecondEpoch(keras.callbacks.Callback):
    """Sends SIGTERM to this process as the second epoch's first host call begins."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and batch == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def main(out: str) -> None:
    hvd.init()
    rank = hvd.rank()
    run_dir = os.path.join(out, "run")
    horovod = dict(strategy="horovod", replicas=2, micro_batch_size=4, gradient_accumulation=2,
                   device_iterations=2, **EPOCHS)
    try:
        trainer_runs.train_run(run_dir, callbacks=[SignalAtSecondEpoch()] if rank == 1 else [],
                               **horovod)
        raise SystemExit(f"rank {rank}: the run was not stopped")
    except Preempted as stopped:
        info = dict(step=stopped.step, by=str(stopped.by), exit_code=stopped.exit_code,
                    checkpoint=str(stopped.checkpoint), message=stopped.describe())
    # Rank 0 has written the checkpoint once it raised: the resume starts after both did.
    hvd.allreduce(tf.constant(0.0), name="stopped_barrier")
    resumed = trainer_runs.train_run(run_dir, resume=True, **horovod)
    np.savez(os.path.join(out, f"rank{rank}.npz"), epochs=np.array(resumed["epochs"]),
             **info, **{f"w{i:03d}": w for i, w in enumerate(resumed["weights"])})
    if rank == 0:
        single = trainer_runs.train_run(os.path.join(out, "single"), one_device=True, **EPOCHS)
        trainer_runs.save(os.path.join(out, "single.npz"), single)


if __name__ == "__main__":
    main(sys.argv[1])
