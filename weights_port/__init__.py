"""timm (PyTorch) EfficientNet weights -> Flax variables, verified numerically.

``convert`` holds the generic renaming/layout rules, ``port`` loading, verification and
writing, ``__main__`` the command line. Imports torch; never imports tensorflow.
"""
from .convert import ConversionError, convert_state_dict, convert_timm, flax_name
from .port import PortResult, VerificationError, load_torch_state_dict, port, verify

__all__ = ["ConversionError", "PortResult", "VerificationError", "convert_state_dict", "convert_timm", "flax_name",
           "load_torch_state_dict", "port", "verify"]
