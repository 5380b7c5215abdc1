"""LogitSpec: next-next-token speculation from the last logit, with n-gram retrieval.

Importing the package imports every module in it, which registers the method.
"""

import importlib
import pkgutil

# Modules that are commands (`python -m ...`), not methods: importing them here would make runpy warn.
COMMANDS = {"motivation"}

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in COMMANDS:
        importlib.import_module(f"{__name__}.{_module.name}")
