"""timm (PyTorch) EfficientNet weights -> Flax variables, verified numerically: the only place the kit imports
torch and timm. ``convert`` holds the generic renaming/layout rules, ``port`` loading, verification and
writing, ``__main__`` the command line.
"""
from .convert import ConversionError, convert_state_dict, convert_timm, flax_name
from .port import OutputError, PortResult, VerificationError, check_output, load_torch_state_dict, port, verify

__all__ = ["ConversionError", "OutputError", "PortResult", "VerificationError", "check_output", "convert_state_dict",
           "convert_timm", "flax_name", "load_torch_state_dict", "port", "verify"]
