"""dflashx: one reviewed YAML recipe -> a whole DFlash drafter project."""

__version__ = "0.1.0"
