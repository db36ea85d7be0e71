"""Run as one multi-worker worker: the trainer on 2 workers x 1 replica, weights saved.

`python multiworker_script.py OUT.npz MODEL_DIR` reads TF_CONFIG (set by the test) and trains
through the trainer and `Runtime.fit`'s own loop (Keras 3 `fit` fails under
MultiWorkerMirroredStrategy, keras#20585). The single-process reference (Keras `fit` on one
device, same global batch) runs in multidevice_script.py to save starting TensorFlow again.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import trainer_runs  # noqa: E402


def main(out: str, model_dir: str) -> None:
    # The strategy starts first (inside train_run): it must precede other TF ops.
    run = trainer_runs.train_run(model_dir, backend="multiworker", replicas=2,
                                 micro_batch_size=8, device_iterations=2)
    trainer_runs.save(out, run)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
