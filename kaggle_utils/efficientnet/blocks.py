"""The four EfficientNet blocks, named like timm's modules (``conv_pw``, ``bn1``, ``se/conv_reduce``, ...:
timm's state-dict names, so ``weights_port`` maps weights by a few generic rules). Every size comes
resolved in a :class:`~kaggle_utils.efficientnet.arch.BlockConfig`."""
import jax.numpy as jnp
from flax import linen as nn

from .arch import BlockConfig
from .layers import BatchNorm, Conv2d, LayerCfg, drop_path


class SqueezeExcite(nn.Module):
    """Channel gate: global mean (fp32) -> reduce -> act -> expand -> sigmoid -> scale."""

    rd_chs: int
    cfg: LayerCfg

    @nn.compact
    def __call__(self, x):
        s = x.astype(jnp.float32).mean(axis=(1, 2), keepdims=True).astype(x.dtype)
        s = Conv2d(self.rd_chs, 1, self.cfg, use_bias=True, name="conv_reduce")(s)
        s = self.cfg.act_fn(s)
        s = Conv2d(x.shape[-1], 1, self.cfg, use_bias=True, name="conv_expand")(s)
        return x * nn.sigmoid(s)


class _Block(nn.Module):
    """Shared residual handling: drop path on the branch, then add the shortcut."""

    block: BlockConfig
    cfg: LayerCfg

    def residual(self, x, shortcut, train: bool):
        if not self.block.has_skip:
            return x
        if train and self.block.drop_path_rate > 0:
            x = drop_path(x, self.block.drop_path_rate, self.make_rng("dropout"))
        return x + shortcut

    def conv(self, features, kernel_size, name, stride=1, groups=1):
        return Conv2d(features, kernel_size, self.cfg, stride=stride, groups=groups, name=name)

    def bn(self, name):
        return BatchNorm(self.cfg, name=name)


class ConvBnAct(_Block):
    """``cn``: k x k conv, BN, act (the first V2 stage)."""

    @nn.compact
    def __call__(self, x, train: bool):
        b, act = self.block, self.cfg.act_fn
        y = act(self.bn("bn1")(self.conv(b.out_chs, b.kernel_size, "conv", b.stride)(x), train))
        return self.residual(y, x, train)


class DepthwiseSeparable(_Block):
    """``ds``: depthwise conv, BN, act, SE, 1x1 conv, BN (act only for ``dsa``)."""

    @nn.compact
    def __call__(self, x, train: bool):
        b, act = self.block, self.cfg.act_fn
        y = act(self.bn("bn1")(self.conv(b.in_chs, b.kernel_size, "conv_dw", b.stride, groups=b.in_chs)(x), train))
        if b.se_chs:
            y = SqueezeExcite(b.se_chs, self.cfg, name="se")(y)
        y = self.bn("bn2")(self.conv(b.out_chs, 1, "conv_pw")(y), train)
        if b.block_type == "dsa":  # an activation after the point-wise conv too
            y = act(y)
        return self.residual(y, x, train)


class InvertedResidual(_Block):
    """``ir`` (MBConv): 1x1 expand, BN, act, depthwise (stride), BN, act, SE, 1x1 project, BN."""

    @nn.compact
    def __call__(self, x, train: bool):
        b, act = self.block, self.cfg.act_fn
        y = act(self.bn("bn1")(self.conv(b.mid_chs, 1, "conv_pw")(x), train))
        y = act(self.bn("bn2")(self.conv(b.mid_chs, b.kernel_size, "conv_dw", b.stride, groups=b.mid_chs)(y), train))
        if b.se_chs:
            y = SqueezeExcite(b.se_chs, self.cfg, name="se")(y)
        y = self.bn("bn3")(self.conv(b.out_chs, 1, "conv_pwl")(y), train)
        return self.residual(y, x, train)


class EdgeResidual(_Block):
    """``er`` (FusedMBConv): k x k expand (stride), BN, act, SE, 1x1 project, BN."""

    @nn.compact
    def __call__(self, x, train: bool):
        b, act = self.block, self.cfg.act_fn
        y = act(self.bn("bn1")(self.conv(b.mid_chs, b.kernel_size, "conv_exp", b.stride)(x), train))
        if b.se_chs:
            y = SqueezeExcite(b.se_chs, self.cfg, name="se")(y)
        y = self.bn("bn2")(self.conv(b.out_chs, 1, "conv_pwl")(y), train)
        return self.residual(y, x, train)


BLOCKS = {"cn": ConvBnAct, "ds": DepthwiseSeparable, "dsa": DepthwiseSeparable, "ir": InvertedResidual,
          "er": EdgeResidual}
