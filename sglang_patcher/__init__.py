"""sglpatch: versioned patchsets for SGLang installs on remote GPU hosts."""

__version__ = "0.1.0"
