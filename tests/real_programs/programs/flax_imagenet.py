"""The Flax ImageNet example's training loop, ResNet18 on synthetic images.

Written the way the example (flax/examples/imagenet: models.py, train.py) writes it: a linen
ResNet with BatchNorm, a `TrainState` with `batch_stats`, an SGD-momentum optimizer on a
warmup-cosine schedule, `train_step` / `eval_step` pmapped over a `'batch'` axis with
`lax.pmean` of gradients and metrics, `sync_batch_stats` as a pmapped cross-replica mean,
`flax.jax_utils.replicate` / `unreplicate` around the loop and `common_utils.shard` for the
batches. Smaller images and filters than ImageNet so a few steps run on CPU.
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from flax import linen as nn
from flax.training import common_utils, train_state
from jax import lax

ModuleDef = Any
NUM_CLASSES = 10
IMAGE_SIZE = 32


class ResNetBlock(nn.Module):
  """ResNet block (two 3x3 convolutions and a projected shortcut)."""
  filters: int
  conv: ModuleDef
  norm: ModuleDef
  act: Callable
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (3, 3), self.strides)(x)
    y = self.norm()(y)
    y = self.act(y)
    y = self.conv(self.filters, (3, 3))(y)
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(residual)
      residual = self.norm(name="norm_proj")(residual)
    return self.act(residual + y)


class ResNet(nn.Module):
  stage_sizes: Sequence[int]
  num_classes: int
  num_filters: int = 64
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, dtype=self.dtype, axis_name="batch")
    x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
    x = norm(name="bn_init")(x)
    x = nn.relu(x)
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for i, block_size in enumerate(self.stage_sizes):
      for j in range(block_size):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = ResNetBlock(self.num_filters * 2**i, strides=strides, conv=conv, norm=norm,
                        act=nn.relu)(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
    return jnp.asarray(x, self.dtype)


ResNet18 = functools.partial(ResNet, stage_sizes=[2, 2, 2, 2])


class TrainState(train_state.TrainState):
  batch_stats: Any


def cross_entropy_loss(logits, labels):
  one_hot_labels = common_utils.onehot(labels, num_classes=NUM_CLASSES)
  return jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot_labels))


def compute_metrics(logits, labels):
  metrics = {"loss": cross_entropy_loss(logits, labels),
             "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}
  return lax.pmean(metrics, axis_name="batch")


def train_step(state, batch, learning_rate_fn):
  """One step: gradients averaged over the 'batch' axis, BatchNorm statistics updated."""
  def loss_fn(params):
    logits, new_model_state = state.apply_fn(
        {"params": params, "batch_stats": state.batch_stats}, batch["image"],
        mutable=["batch_stats"])
    loss = cross_entropy_loss(logits, batch["label"])
    weight_l2 = sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(params) if x.ndim > 1)
    return loss + 1e-4 * 0.5 * weight_l2, (new_model_state, logits)

  lr = learning_rate_fn(state.step)
  (_, (new_model_state, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grads = lax.pmean(grads, axis_name="batch")
  metrics = compute_metrics(logits, batch["label"])
  metrics["learning_rate"] = lr
  new_state = state.apply_gradients(grads=grads, batch_stats=new_model_state["batch_stats"])
  return new_state, metrics


def eval_step(state, batch):
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  logits = state.apply_fn(variables, batch["image"], train=False, mutable=False)
  return compute_metrics(logits, batch["label"])


# The example's sync_batch_stats: a pmapped cross-replica mean of the BatchNorm statistics.
cross_replica_mean = jax.pmap(lambda x: lax.pmean(x, "x"), "x")


def sync_batch_stats(state):
  return state.replace(batch_stats=cross_replica_mean(state.batch_stats))


def create_train_state(rng, model, learning_rate_fn):
  variables = jax.jit(functools.partial(model.init, train=False))(
      {"params": rng}, jnp.ones((1, IMAGE_SIZE, IMAGE_SIZE, 3), model.dtype))
  tx = optax.sgd(learning_rate=learning_rate_fn, momentum=0.9, nesterov=True)
  return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                           batch_stats=variables["batch_stats"])


def synthetic_batches(num_batches: int, batch_size: int, seed: int):
  rng = np.random.default_rng(seed)
  for _ in range(num_batches):
    yield {"image": rng.normal(size=(batch_size, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32),
           "label": rng.integers(0, NUM_CLASSES, size=(batch_size,)).astype(np.int32)}


def run(train_steps: int = 3, eval_steps: int = 1, per_device_batch: int = 2,
        num_filters: int = 16) -> dict[str, Any]:
  """Trains for `train_steps`, syncs BatchNorm statistics, evaluates; returns state and
  metrics of every step as host arrays."""
  batch_size = per_device_batch * jax.local_device_count()
  model = ResNet18(num_classes=NUM_CLASSES, num_filters=num_filters)
  learning_rate_fn = optax.join_schedules(
      [optax.linear_schedule(0.0, 0.1, 2), optax.cosine_decay_schedule(0.1, 10)], [2])
  state = create_train_state(jax.random.PRNGKey(0), model, learning_rate_fn)
  state = jax_utils.replicate(state)
  p_train_step = jax.pmap(functools.partial(train_step, learning_rate_fn=learning_rate_fn),
                          axis_name="batch")
  p_eval_step = jax.pmap(eval_step, axis_name="batch")

  train_metrics = []
  for batch in synthetic_batches(train_steps, batch_size, seed=1):
    state, metrics = p_train_step(state, common_utils.shard(batch))
    train_metrics.append(metrics)
  state = sync_batch_stats(state)
  eval_metrics = [p_eval_step(state, common_utils.shard(batch))
                  for batch in synthetic_batches(eval_steps, batch_size, seed=2)]
  return jax.tree_util.tree_map(np.asarray, {
      "state": jax_utils.unreplicate(state),
      "train_metrics": common_utils.get_metrics(train_metrics),
      "eval_metrics": common_utils.get_metrics(eval_metrics)})


if __name__ == "__main__":
  if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 before running")
  out = run()
  print("train loss per step:", out["train_metrics"]["loss"].tolist())
  print("eval accuracy:", out["eval_metrics"]["accuracy"].tolist())
