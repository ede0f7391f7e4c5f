"""Architecture definitions: timm's block strings, one decoder, one builder, a variant table.

Every variant is data (block strings such as ``ir_r2_k3_s2_e6_c24_se0.25`` and a few scalars);
:func:`build_blocks` resolves each block's sizes with timm's ``EfficientNetBuilder`` arithmetic.
"""
import dataclasses
import math
import re
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class BlockArgs:
    """One decoded block string, before width scaling (timm's ``_decode_block_str``)."""

    block_type: str  # cn | er | ir | ds | dsa
    kernel_size: int
    stride: int
    exp_ratio: float
    out_chs: int
    se_ratio: float = 0.0
    skip: bool | None = None  # None: the type's default rule; True/False: forced


def decode_block_str(block_str: str) -> tuple[BlockArgs, int]:
    """``'ir_r2_k3_s2_e6_c24_se0.25'`` -> (BlockArgs, repeats=2)."""
    block_type, *ops = block_str.split("_")
    if block_type not in ("cn", "er", "ir", "ds", "dsa"):
        raise ValueError(f"unknown block type {block_type!r} in block string {block_str!r}")
    skip = True if "skip" in ops else False if "noskip" in ops else None
    options: dict[str, str] = {}
    for op in (op for op in ops if op not in ("skip", "noskip")):
        match = re.fullmatch(r"([a-z]+)(\d.*)", op)
        if match is None:
            raise ValueError(f"cannot parse option {op!r} in block string {block_str!r}")
        options[match.group(1)] = match.group(2)
    missing = [k for k in ("r", "k", "s", "c") if k not in options]
    if missing:
        raise ValueError(f"block string {block_str!r} lacks option(s) {missing}")
    args = BlockArgs(block_type, kernel_size=int(options["k"]), stride=int(options["s"]),
                     exp_ratio=float(options.get("e", 1.0)), out_chs=int(options["c"]),
                     se_ratio=float(options.get("se", 0.0)), skip=skip)
    return args, int(options["r"])


def _scale_stage_depth(stage: Sequence[tuple[BlockArgs, int]], multiplier: float) -> list[BlockArgs]:
    """timm's ``_scale_stage_depth`` with ``depth_trunc='ceil'``."""
    repeats = [r for _, r in stage]
    num_repeat = sum(repeats)
    num_scaled = int(math.ceil(num_repeat * multiplier))
    scaled = []
    for r in repeats[::-1]:  # reverse, so the first block def is the least likely to grow
        rs = max(1, round(r / num_repeat * num_scaled))
        scaled.append(rs)
        num_repeat -= r
        num_scaled -= rs
    return [args for (args, _), rep in zip(stage, scaled[::-1]) for _ in range(rep)]


def decode_arch_def(arch_def: Sequence[Sequence[str]], depth_multiplier: float | Sequence[float] = 1.0,
                    fix_first_last: bool = False) -> list[list[BlockArgs]]:
    """Stages of block strings -> stages of BlockArgs, depth-scaled (timm's ``decode_arch_def``)."""
    if isinstance(depth_multiplier, (int, float)):
        depth_multiplier = (float(depth_multiplier),) * len(arch_def)
    if len(depth_multiplier) != len(arch_def):
        raise ValueError(f"{len(depth_multiplier)} depth multipliers for {len(arch_def)} stages")
    stages = []
    for i, (block_strs, mult) in enumerate(zip(arch_def, depth_multiplier)):
        decoded = [decode_block_str(s) for s in block_strs]
        if fix_first_last and i in (0, len(arch_def) - 1):
            mult = 1.0
        stages.append(_scale_stage_depth(decoded, mult))
    return stages


def make_divisible(v: float, divisor: int = 8, round_limit: float = 0.9) -> int:
    """Nearest multiple of ``divisor``, never more than ``1 - round_limit`` below ``v`` (timm)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_INCEPTION = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything that distinguishes one registered variant from another (hashable)."""

    name: str
    arch_def: tuple[tuple[str, ...], ...]
    channel_multiplier: float = 1.0
    depth_multiplier: float | tuple[float, ...] = 1.0
    stem_size: int = 32
    fix_stem: bool = False
    num_features: int = 1280
    scale_num_features: bool = True  # head width = round_channels(num_features) vs fixed
    round_limit: float = 0.9  # 0.0 for the V2 base family (B0-B3)
    fix_first_last: bool = False  # Lite: first and last stage depth not scaled
    act: str = "silu"
    padding: str = "symmetric"  # "same" (TF, tf_* variants) or "symmetric" (PyTorch)
    bn_eps: float = 1e-5
    # timm's default pretrained_cfg for this name (the weights' preprocessing):
    mean: tuple[float, float, float] = _IMAGENET[0]
    std: tuple[float, float, float] = _IMAGENET[1]
    input_size: int = 224
    crop_pct: float = 0.875
    interpolation: str = "bicubic"

    def round_channels(self, channels: int) -> int:
        return make_divisible(channels * self.channel_multiplier, 8, round_limit=self.round_limit)

    @property
    def stem_chs(self) -> int:
        return self.stem_size if self.fix_stem else self.round_channels(self.stem_size)

    @property
    def head_chs(self) -> int:
        return self.round_channels(self.num_features) if self.scale_num_features else self.num_features


_EFFICIENTNET_V1 = (
    ("ds_r1_k3_s1_e1_c16_se0.25",),
    ("ir_r2_k3_s2_e6_c24_se0.25",),
    ("ir_r2_k5_s2_e6_c40_se0.25",),
    ("ir_r3_k3_s2_e6_c80_se0.25",),
    ("ir_r3_k5_s1_e6_c112_se0.25",),
    ("ir_r4_k5_s2_e6_c192_se0.25",),
    ("ir_r1_k3_s1_e6_c320_se0.25",),
)
_EFFICIENTNET_LITE = tuple((s.replace("_se0.25", ""),) for (s,) in _EFFICIENTNET_V1)
# EfficientNetV2 (timm's arch_defs, as the paper's table 4): one block string per stage, filled with the
# (repeats, channels) of each size; the base family B0-B3 has the first six stages.
_V2_STAGES = ("cn_r{}_k3_s1_e1_c{}_skip", "er_r{}_k3_s2_e4_c{}", "er_r{}_k3_s2_e4_c{}", "ir_r{}_k3_s2_e4_c{}_se0.25",
              "ir_r{}_k3_s1_e6_c{}_se0.25", "ir_r{}_k3_s2_e6_c{}_se0.25", "ir_r{}_k3_s1_e6_c{}_se0.25")
_V2 = {size: tuple((stage.format(*rc),) for stage, rc in zip(_V2_STAGES, stages)) for size, stages in {
    "base": ((1, 16), (2, 32), (2, 48), (3, 96), (5, 112), (8, 192)),
    "s": ((2, 24), (4, 48), (4, 64), (6, 128), (9, 160), (15, 256)),
    "m": ((3, 24), (5, 48), (5, 80), (7, 160), (14, 176), (18, 304), (5, 512)),
    "l": ((4, 32), (7, 64), (7, 96), (10, 192), (19, 224), (25, 384), (7, 640)),
    "xl": ((4, 32), (8, 64), (8, 96), (16, 192), (24, 256), (32, 512), (8, 640)),
}.items()}
_V2_S_RW = (("er_r2_k3_s1_e1_c24",),) + _V2["s"][1:-1] + (("ir_r15_k3_s2_e6_c272_se0.25",),)

_TF = dict(padding="same", bn_eps=1e-3)

# timm's minimal test network: one block per stage, every block type, a 256-wide head.
_TEST = (
    ("cn_r1_k3_s1_e1_c16_skip",),
    ("er_r1_k3_s2_e4_c24",),
    ("er_r1_k3_s2_e4_c32",),
    ("ir_r1_k3_s2_e4_c48_se0.25",),
    ("ir_r1_k3_s2_e4_c64_se0.25",),
)


def _cfg(norm, input_size, crop_pct=1.0, interpolation="bicubic"):
    mean, std = norm
    return dict(mean=mean, std=std, input_size=input_size, crop_pct=crop_pct, interpolation=interpolation)


def _registry() -> dict[str, ModelSpec]:
    specs: list[ModelSpec] = []
    add = lambda name, **kw: specs.append(ModelSpec(name=name, **kw))  # noqa: E731

    # EfficientNetV2, official definitions (PyTorch padding and TF-ported 'tf_' weights).
    for size, stem, pt_res, tf_res in (("s", 24, 288, 300), ("m", 24, 320, 384), ("l", 32, 384, 384),
                                       ("xl", 32, 384, 384)):
        kw = dict(arch_def=_V2[size], stem_size=stem, scale_num_features=size == "s")  # M-XL: a fixed head width
        add(f"efficientnetv2_{size}", **kw, **_cfg(_IMAGENET, pt_res))
        add(f"tf_efficientnetv2_{size}", **kw, **_TF, **_cfg(_INCEPTION, tf_res))
    base = dict(arch_def=_V2["base"], stem_size=32, round_limit=0.0, **_TF)
    for b, (w, d, res, crop, norm) in {
        "b0": (1.0, 1.0, 192, 0.875, _IMAGENET),
        "b1": (1.0, 1.1, 192, 0.882, _IMAGENET),
        "b2": (1.1, 1.2, 208, 0.89, _IMAGENET),
        "b3": (1.2, 1.4, 240, 0.9, _INCEPTION),
    }.items():
        add(f"tf_efficientnetv2_{b}", channel_multiplier=w, depth_multiplier=d, **base, **_cfg(norm, res, crop))
    # Ross Wightman's variants, defined before the official release.
    add("efficientnetv2_rw_t", arch_def=_V2["s"], stem_size=24, channel_multiplier=0.8, depth_multiplier=0.9,
        **_cfg(_IMAGENET, 224))
    add("efficientnetv2_rw_s", arch_def=_V2_S_RW, stem_size=24, num_features=1792, **_cfg(_IMAGENET, 288))
    add("efficientnetv2_rw_m", arch_def=_V2_S_RW, stem_size=24, num_features=1792, channel_multiplier=1.2,
        depth_multiplier=(1.2,) * 4 + (1.6,) * 2, **_cfg(_IMAGENET, 320))

    # EfficientNet (V1): (width, depth, timm default input size, crop) per size.
    v1 = [(1.0, 1.0), (1.0, 1.1), (1.1, 1.2), (1.2, 1.4), (1.4, 1.8), (1.6, 2.2), (1.8, 2.6), (2.0, 3.1), (2.2, 3.6)]
    pt_cfgs = [(224, 0.875, _IMAGENET), (240, 0.9, _INCEPTION), (256, 0.875, _IMAGENET), (288, 0.875, _IMAGENET),
               (320, 0.875, _IMAGENET), (448, 1.0, _IMAGENET), (528, 0.942, _IMAGENET), (600, 0.949, _IMAGENET)]
    tf_cfgs = [(224, 0.875), (240, 0.882), (260, 0.89), (300, 0.904), (380, 0.922), (456, 0.934), (528, 0.942),
               (600, 0.949), (672, 0.954)]
    for i, (w, d) in enumerate(v1):
        common = dict(arch_def=_EFFICIENTNET_V1, channel_multiplier=w, depth_multiplier=d)
        if i < len(pt_cfgs):
            res, crop, norm = pt_cfgs[i]
            add(f"efficientnet_b{i}", **common, **_cfg(norm, res, crop))
        res, crop = tf_cfgs[i]
        add(f"tf_efficientnet_b{i}", **common, **_TF, **_cfg(_INCEPTION if i == 8 else _IMAGENET, res, crop))

    # EfficientNet-Lite: no SE, ReLU6, fixed stem/head and first/last stage depth.
    lite_res = [(224, 0.875), (240, 0.882), (260, 0.89), (300, 0.904), (380, 0.922)]
    for i, ((w, d), (res, crop)) in enumerate(zip(v1, lite_res)):
        common = dict(arch_def=_EFFICIENTNET_LITE, channel_multiplier=w, depth_multiplier=d, fix_stem=True,
                      scale_num_features=False, fix_first_last=True, act="relu6")
        add(f"efficientnet_lite{i}", **common, **_cfg(_IMAGENET, res, crop))
        tf_interp = "bilinear" if i >= 3 else "bicubic"
        tf_crop = 0.92 if i == 4 else crop
        add(f"tf_efficientnet_lite{i}", **common, **_TF, **_cfg(_INCEPTION, res, tf_crop, tf_interp))

    # timm's `test_efficientnet`: its seconds-to-compile size makes it the model of tests about
    # anything but the network (jobs, loops, checkpoints); its own parity is checked like every name.
    add("test_efficientnet", arch_def=_TEST, stem_size=24, num_features=256, round_limit=0.0,
        **_cfg(_IMAGENET, 160, 0.95))
    return {s.name: s for s in specs}


_SPECS = _registry()

# The seed tutorial's short names: "m" is tf_efficientnetv2_m (the TF-ported ImageNet-21k weights).
_SHORT_NAMES = {k: f"tf_efficientnetv2_{k}" for k in ("s", "m", "l", "xl", "b0", "b1", "b2", "b3")}


def list_models() -> list[str]:
    return sorted(_SPECS)


def resolve_name(name: str) -> str:
    """Accepts timm names and the short V2 names (``"m"`` -> ``"tf_efficientnetv2_m"``)."""
    name = _SHORT_NAMES.get(name, name)
    if name not in _SPECS:
        raise ValueError(f"unknown model {name!r}; choose one of {list_models()} or {sorted(_SHORT_NAMES)}")
    return name


def get_spec(name: str) -> ModelSpec:
    return _SPECS[resolve_name(name)]


def pretrained_cfg(name: str) -> dict:
    """Preprocessing of timm's default weights for ``name`` (mean/std on the 0-1 scale)."""
    s = get_spec(name)
    return dict(name=s.name, mean=s.mean, std=s.std, input_size=(3, s.input_size, s.input_size),
                crop_pct=s.crop_pct, interpolation=s.interpolation)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """One block with every size resolved; what ``blocks.py`` instantiates."""

    block_type: str
    in_chs: int
    out_chs: int
    mid_chs: int  # expanded width (== in_chs for cn / ds)
    kernel_size: int
    stride: int
    se_chs: int  # 0: no squeeze-and-excite
    has_skip: bool
    drop_path_rate: float


def _resolve_block(args: BlockArgs, in_chs: int, stride: int, spec: ModelSpec, drop_path_rate: float) -> BlockConfig:
    out_chs = spec.round_channels(args.out_chs)
    t = args.block_type
    mid_chs = make_divisible(in_chs * args.exp_ratio) if t in ("ir", "er") else in_chs
    # timm divides the ratio by the expansion, so SE width follows the block INPUT width (0: no SE)
    se_chs = round(mid_chs * (args.se_ratio / args.exp_ratio)) if t in ("ir", "er") else round(in_chs * args.se_ratio)
    # timm: a residual where the shapes allow it; "cn" only when asked ("_skip"), "dsa" never, others unless "_noskip"
    asked = args.skip is True if t == "cn" else t != "dsa" and args.skip is not False
    has_skip = asked and stride == 1 and in_chs == out_chs
    return BlockConfig(t, in_chs, out_chs, mid_chs, args.kernel_size, stride, se_chs, has_skip, drop_path_rate)


def build_blocks(spec: ModelSpec, drop_path_rate: float = 0.0) -> tuple[tuple[BlockConfig, ...], ...]:
    """Resolves every block of ``spec``: stages of BlockConfig, as timm's EfficientNetBuilder."""
    stages_args = decode_arch_def(spec.arch_def, spec.depth_multiplier, spec.fix_first_last)
    total = sum(len(s) for s in stages_args)
    in_chs, idx, stages = spec.stem_chs, 0, []
    for stage_args in stages_args:
        blocks = []
        for j, args in enumerate(stage_args):
            stride = args.stride if j == 0 else 1  # only the first block of a stage strides
            cfg = _resolve_block(args, in_chs, stride, spec, drop_path_rate * idx / total)
            blocks.append(cfg)
            in_chs, idx = cfg.out_chs, idx + 1
        stages.append(tuple(blocks))
    return tuple(stages)


def feature_stages(stages: Sequence[Sequence[BlockConfig]]) -> list[int]:
    """Stage indices whose outputs are timm's ``features_only`` maps (-1 = the stem): the last stage and
    each stage followed by a downsampling one."""
    stem = [-1] if stages[0][0].stride > 1 else []
    return stem + [i for i in range(len(stages)) if i + 1 == len(stages) or stages[i + 1][0].stride > 1]
