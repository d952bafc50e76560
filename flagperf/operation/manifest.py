"""The operation family's engine.yaml, apart from the implementations' contract (flagperf.operation.impls, which
needs torch): `flagperf validate` checks a manifest where torch is not installed."""

from __future__ import annotations

from typing import ClassVar

from flagperf.config.engines import EngineManifest

IMPLEMENTATIONS_FOLDER = "operation"  # vendor_images/<vendor>/operation/<implementation>/


class ImplementationManifest(EngineManifest):
    module_prefix: ClassVar[str] = "flagperf.operation."
