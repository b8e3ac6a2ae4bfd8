"""``gpext.integrations.botorch`` needs the botorch extra and says how to install it."""

from __future__ import annotations

import importlib
import sys

import pytest
from botorch.utils.testing import BotorchTestCase

from gpext.errors import GpextError


class TestImportWithoutBotorch(BotorchTestCase):
    def test_missing_botorch_raises_gpext_error(self):
        with pytest.MonkeyPatch.context() as mp:
            for name in [m for m in sys.modules if m.startswith("gpext.integrations.botorch")]:
                mp.delitem(sys.modules, name)
            mp.setitem(sys.modules, "botorch", None)  # makes `import botorch` fail
            with pytest.raises(GpextError, match=r"pip install gpext\[botorch\]") as info:
                importlib.import_module("gpext.integrations.botorch")
            self.assertIsInstance(info.value, ImportError)
        mod = importlib.import_module("gpext.integrations.botorch")
        self.assertTrue(hasattr(mod, "IGNSurrogate"))

    def test_public_names_documented(self):
        mod = importlib.import_module("gpext.integrations.botorch")
        self.assertTrue(mod.__doc__)
        for name in mod.__all__:
            obj = getattr(mod, name)
            self.assertTrue(obj.__doc__, name)
