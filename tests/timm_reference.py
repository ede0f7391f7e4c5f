"""Reference timm models with random but realistic weights, for parity tests.

Random weights make a deep EfficientNet chaotic: each residual branch adds about as much as
the stream carries, so any mismatch between the BN statistics and the data (which random
statistics always are) compounds by ~10x per stage, and float rounding turns into O(1)
logit differences in either implementation. Real weights don't behave like that. Two
steps keep the weights random while the activations stay in a realistic range:

* BN statistics are calibrated on a random batch (not the one compared), then perturbed;
* the last BN of every residual branch gets a small gamma (the "zero-init last BN" trick,
  here 0.05-0.2 instead of 0), so the residual stream grows slowly with depth.

Importing this module makes torch compute on one thread in this process: the reference
forwards are on tiny inputs, where a second thread gains nothing, and on a machine shared by
more processes than cores (pytest-xdist workers, JAX's own threads) torch's threads wait for
each other at every op, which made the forwards many times slower than on one thread.
"""
import numpy as np
import timm
import torch

torch.set_num_threads(1)


def _branch_end_norms(model):
    for block in model.modules():
        if getattr(block, "has_skip", False):
            norms = [m for m in block.modules() if isinstance(m, torch.nn.BatchNorm2d)]
            yield norms[-1]


def random_timm_model(name: str, *, seed: int = 0, num_classes: int = 1000, calib_size: int = 64,
                      calib_batch: int = 8, **kwargs):
    """A timm model in eval mode with random weights and randomised, calibrated BN statistics."""
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: the statistics of the calibration batch
        for bn in _branch_end_norms(model):
            bn.weight.uniform_(0.05, 0.2)
        model.train()
        model(torch.randn(calib_batch, 3, calib_size, calib_size))
        for bn in bns:
            bn.running_mean += 0.1 * torch.randn_like(bn.running_mean) * bn.running_var.sqrt()
            bn.running_var *= torch.empty_like(bn.running_var).uniform_(0.8, 1.25)
            bn.momentum = 0.1
    return model.eval()


def timm_forward(model, x_nhwc: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)))).numpy()


def to_nhwc(t: torch.Tensor) -> np.ndarray:
    return t.detach().permute(0, 2, 3, 1).numpy()
