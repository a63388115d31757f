"""Learning rules as optax transforms: plain GD, GD with weight decay, norm-constrained GD.

Magen et al. (SPEC §2) study two limits of gradient descent on ``f = v^T X^T S(X p)``:

- **weight decay** (min-norm limit): ``theta <- theta - beta (grad L + lambda theta)``, built as
  ``optax.chain(optax.add_decayed_weights(lambda), optax.sgd(beta))``;
- **norm-constrained projected GD** (max-margin rule): a GD step, then each parameter group is
  projected back on its l2 ball, ``||v|| <= r`` (head group) and ``||p|| <= R`` (query group,
  Frobenius norm for matrices), with ``optax.projections.projection_l2_ball``.

optax 0.2.8 has the projections but no transform that applies one to the *parameters* after an
update, so :func:`project_params` is that transform: its update returns ``proj(params + u) -
params``, so that ``optax.apply_updates`` lands exactly on the projected point.

Settings (registered here): ``weight_decay`` (swept, lambda, 0 = off), ``project`` (static bool),
``radius_v`` (swept, r), ``radius_p`` (swept, R).
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from .config import register_setting


def _nonneg(v):
    return None if v >= 0 else "must be >= 0"


def _positive(v):
    return None if v > 0 else "must be > 0"


register_setting("weight_decay", 0.0, float, "swept",
                 "weight decay lambda: GD on L + (lambda/2)||theta||^2 (optax.add_decayed_weights)",
                 _nonneg)
register_setting("project", False, bool, "static",
                 "norm-constrained GD: project v on ||v|| <= radius_v and the query parameters on "
                 "||p|| <= radius_p after every step (max-margin rule of Magen et al.)")
register_setting("radius_v", 1.0, float, "swept", "r: radius of the head ball ||v|| <= r",
                 _positive)
register_setting("radius_p", 1.0, float, "swept",
                 "R: radius of the query ball ||p|| <= R (Frobenius norm for a matrix W)",
                 _positive)


def project_params(project: Callable) -> optax.GradientTransformation:
    """A transform that makes ``params + update`` equal ``project(params + update)``.

    Chain it last: ``optax.chain(optax.sgd(lr), project_params(proj))``.
    """

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("project_params needs params: call update(grads, state, params)")
        new = project(optax.apply_updates(params, updates))
        return jax.tree.map(lambda a, b: a - b, new, params), state

    return optax.GradientTransformation(init_fn, update_fn)


def ball_projection(groups: Callable, radii: tuple) -> Callable:
    """``params -> params`` with ``groups(params) -> tuple of subtrees`` projected on l2 balls.

    ``groups`` must return the subtrees in the order of ``radii`` (each subtree is projected as a
    whole: its norm is the l2 norm of all its leaves together).
    """
    def project(params):
        parts = groups(params)
        new = tuple(optax.projections.projection_l2_ball(p, r) for p, r in zip(parts, radii))
        return eqx.tree_at(groups, params, new)

    return project


def make_optimizer(
    static, sw: dict, groups: Callable | None = None
) -> optax.GradientTransformation:
    """The optimiser of a run: ``sgd(lr)``, preceded by weight decay, followed by projection.

    ``groups(params) -> (head subtree, query subtree)`` names the parameters the radii
    ``(radius_v, radius_p)`` constrain; required when ``static.project``.
    """
    parts = [optax.add_decayed_weights(sw["weight_decay"]), optax.sgd(sw["lr"])]
    if static.project:
        if groups is None:
            raise ValueError("this model has no norm groups; project = true is not supported")
        parts.append(project_params(ball_projection(groups, (sw["radius_v"], sw["radius_p"]))))
    return optax.chain(*parts)


def tree_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))
