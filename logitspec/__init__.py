"""LogitSpec: next-next-token speculation from the last logit, with n-gram retrieval.

Importing the package imports every module in it, which registers the method.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
