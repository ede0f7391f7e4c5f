"""Compile once: a second process reads the programs the first compiled from the kept cache folder.

Each side runs in a fresh process without ``JAX_COMPILATION_CACHE_DIR`` (the test session sets
one for itself), the way a restarted Kaggle session starts; JAX's own cache-hit events count.
"""
import json
import os
import subprocess
import sys
import textwrap

from job_helpers import REPO

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    hits = []
    jax.monitoring.register_event_listener(lambda event, **_: hits.append(event))
    from kaggle_utils import compilation
    folder = compilation.enable_cache(sys.argv[1])
    before = compilation.seconds()
    out = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((64, 64)))
    out.block_until_ready()
    print(json.dumps({"folder": str(folder), "hits": hits.count("/jax/compilation_cache/cache_hits"),
                      "compile_s": compilation.seconds() - before}))
""")


def fresh_process(cache, extra_env=None):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update({"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), **(extra_env or {})})
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_session_reads_the_first_sessions_compiled_programs(tmp_path):
    cache = tmp_path / "jax_cache"
    first = fresh_process(cache)
    assert first["folder"] == str(cache) and first["hits"] == 0 and first["compile_s"] > 0
    assert any(cache.iterdir()), "nothing was written to the cache folder"
    second = fresh_process(cache)
    assert second["hits"] >= 1


def test_a_cache_folder_the_user_chose_is_kept(tmp_path):
    chosen = tmp_path / "mine"
    result = fresh_process(tmp_path / "ours", {"JAX_COMPILATION_CACHE_DIR": str(chosen)})
    assert result["folder"] == str(chosen) and not (tmp_path / "ours").exists()
