"""Threefry-2x32 lowered unrolled on the CPU: the same bits as JAX's own lowering."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

from phasebo.threefry import threefry2x32, unroll_threefry_cpu

U = np.uint32

# Known-answer vectors of Threefry-2x32 with 20 rounds (Random123's kat_vectors; the first is
# also JAX's own test): (key, counter) -> output
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def test_numpy_threefry_matches_the_published_vectors():
    for (k1, k2), (x1, x2), want in KAT:
        got = threefry2x32(U(k1), U(k2), U(x1), U(x2))
        assert tuple(int(v) for v in got) == want


def test_the_registered_lowering_is_threefry_and_has_no_loop():
    from jax.extend.random import threefry2x32_p

    assert unroll_threefry_cpu(environ={})
    rng = np.random.default_rng(0)
    k1, k2 = (U(v) for v in rng.integers(0, 2**32, 2))
    x1, x2 = (rng.integers(0, 2**32, 1000).astype(U) for _ in range(2))
    f = jax.jit(lambda a, b: threefry2x32_p.bind(jnp.uint32(k1), jnp.uint32(k2), a, b))
    y1, y2 = f(x1, x2)
    r1, r2 = threefry2x32(k1, k2, x1, x2)
    np.testing.assert_array_equal(np.asarray(y1), r1)
    np.testing.assert_array_equal(np.asarray(y2), r2)
    # JAX's own CPU lowering is a 5-trip loop over the whole array; the unrolled one is not
    assert "while" not in f.lower(x1, x2).compile().as_text()


DRAWS = """
import json, jax, jax.numpy as jnp, jax.random as jr
from phasebo.threefry import unroll_threefry_cpu
print(json.dumps({"registered": unroll_threefry_cpu(),
                  "normal": jax.jit(lambda k: jr.normal(k, (257,), jnp.float32))(jr.key(3)).tolist(),
                  "bits": jax.jit(jax.vmap(lambda k: jr.bits(k, (5,), jnp.uint32)))(
                      jr.split(jr.key(7), 4)).ravel().tolist()}))
"""


@pytest.mark.optimized  # the subprocess compiles as users do
def test_draws_are_the_same_bit_for_bit_as_jaxs_own_lowering():
    """A process with ``PHASEBO_XLA_TUNING=0`` keeps JAX's lowering; this one unrolls it."""
    env = {**os.environ, "PHASEBO_XLA_TUNING": "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", DRAWS], env=env, capture_output=True,
                         text=True, check=True)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert theirs["registered"] is False
    assert unroll_threefry_cpu(environ={})
    normal = jax.jit(lambda k: jr.normal(k, (257,), jnp.float32))(jr.key(3))
    bits = jax.jit(jax.vmap(lambda k: jr.bits(k, (5,), jnp.uint32)))(jr.split(jr.key(7), 4)).ravel()
    np.testing.assert_array_equal(np.asarray(normal), np.float32(theirs["normal"]))
    np.testing.assert_array_equal(np.asarray(bits), np.asarray(theirs["bits"], np.uint64))


def test_tuning_off_leaves_jaxs_lowering():
    assert unroll_threefry_cpu(environ={"PHASEBO_XLA_TUNING": "0"}) is False
