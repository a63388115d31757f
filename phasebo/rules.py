"""Learning rules as optax transforms: plain GD, GD with weight decay, norm-constrained GD.

Magen et al. study two limits of gradient descent on attention:

- **weight decay** (min-norm limit): ``theta <- theta - lr (grad L + lambda theta)``, built as
  ``optax.chain(optax.add_decayed_weights(lambda), optax.sgd(lr))``;
- **norm-constrained projected GD** (max-margin rule): a GD step, then each parameter group is
  projected back on its l2 ball (``||v|| <= radius_v`` for the head, ``||p|| <= radius_p`` for the
  query, Frobenius norm for matrices), with ``optax.projections.projection_l2_ball``.

optax has the projections but no transform that applies one to the *parameters* after an update,
so :func:`project_params` is that transform: its update returns ``proj(params + u) - params``, so
that ``optax.apply_updates`` lands exactly on the projected point. The span engines implement the
same rules on their coefficients (:mod:`phasebo.engines.span`), tested against these.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import optax


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


def standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` with its init and update traced under JAX's standard dtype promotion: optax's
    adaptive rules and schedules mix Python floats with the int32 step count, which a strict
    promotion setting (phasebo's tests, a user's) refuses."""

    def init_fn(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update_fn(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)


def ball_projection(groups: Callable, radii: tuple) -> Callable:
    """``params -> params`` with ``groups(params) -> tuple of subtrees`` projected on l2 balls of
    ``radii`` (each subtree as a whole: its norm is the l2 norm of all its leaves together)."""

    def project(params):
        parts = groups(params)
        new = tuple(optax.projections.projection_l2_ball(p, r) for p, r in zip(parts, radii))
        return eqx.tree_at(groups, params, new)

    return project


def make_optimizer(static, sw: dict, groups: Callable | None = None,
                   radii: tuple[str, ...] = ()) -> optax.GradientTransformation:
    """The optimiser of a run: ``sgd(lr)`` (or ``adam``; ``adamw`` with ``weight_decay`` as its
    decoupled decay), preceded by weight decay when the model has the ``weight_decay`` setting
    (sgd, adam), by gradient clipping when ``static.clip_norm > 0``, with a linear decay of the
    step size to 0 over ``static.steps`` when ``static.lr_schedule = "linear"``, and followed by
    the projection when ``static.project``.

    ``groups(params) -> tuple of subtrees`` names the parameters that the radii settings
    ``radii`` (e.g. ``("radius_v", "radius_p")``) constrain; required when ``static.project``.
    """
    parts = []
    name = getattr(static, "optimizer", "sgd")
    lr = sw["lr"]
    if getattr(static, "lr_schedule", "constant") == "linear":
        lr = optax.linear_schedule(lr, 0.0, max(static.steps, 1))
    if getattr(static, "clip_norm", 0.0) > 0:
        parts.append(optax.clip_by_global_norm(static.clip_norm))
    if name == "adamw":
        parts.append(optax.adamw(lr, weight_decay=sw.get("weight_decay", 0.0)))
    else:
        if "weight_decay" in sw:
            parts.append(optax.add_decayed_weights(sw["weight_decay"]))
        parts.append(optax.adam(lr) if name == "adam" else optax.sgd(lr))
    if getattr(static, "project", False):
        if groups is None:
            raise ValueError("this model has no norm groups; project = true is not supported")
        parts.append(project_params(ball_projection(groups, tuple(sw[r] for r in radii))))
    tx = optax.chain(*parts) if len(parts) > 1 else parts[0]
    plain = name == "sgd" and getattr(static, "lr_schedule", "constant") == "constant"
    return tx if plain else standard_promotion(tx)
