"""One process of the two-process training test (started by test_train_multihost.py).

Usage: python multihost_worker.py PROCESS_ID PORT OUT_DIR MODE...
Joins JAX's multi-process runtime (coordinator on 127.0.0.1:PORT, gloo collectives on CPU),
trains the tiny CNN with ``fit`` for each MODE into OUT_DIR/run-MODE-pPROCESS_ID, and saves
its final state and history to OUT_DIR/result-MODE-pPROCESS_ID.npz for the test to compare.
"""
import json
import sys
from pathlib import Path

import jax

process_id, port, out_dir, modes = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from multihost_run import run  # noqa: E402

assert jax.process_count() == 2 and jax.local_device_count() == 2 and jax.device_count() == 4
for mode in modes:
    result = run(mode, out_dir / f"run-{mode}-p{process_id}")
    leaves = {f"leaf{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(result.state))}
    np.savez(out_dir / f"result-{mode}-p{process_id}.npz", history=json.dumps(result.history), **leaves)
jax.distributed.shutdown()
